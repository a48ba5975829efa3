"""The synthetic dataset generator and the bundled sample: MLCommons schema, Harmony prompts,
exact lengths, real ground truths."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from data.synthetic import DATASETS, main, make
from harness.dataset import load_dataset

START, END, MESSAGE = 200006, 200007, 200008


@pytest.fixture(scope="module")
def enc():
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding

    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


@pytest.fixture(scope="module")
def df():
    return make(9, prompt_len=(120, 200), output_len=(5, 50), reasoning="high", seed=3)


def test_schema_lengths_and_harmony_format(df, enc):
    assert list(df.columns) == [
        "tok_input",
        "tok_input_len",
        "dataset",
        "ground_truth",
        "question",
        "max_output_len",
    ]
    assert list(df.dataset) == list(DATASETS) * 3
    for ids, n, out in zip(df.tok_input, df.tok_input_len, df.max_output_len, strict=True):
        assert len(ids) == n and 120 <= n <= 200
        assert 5 <= out <= 50
        text = enc.decode(ids.tolist())
        assert text.startswith("<|start|>system<|message|>") and text.endswith("<|end|><|start|>assistant")
        assert "Reasoning: high" in text
        assert ids[0] == START and ids[-2:].tolist() == [
            START,
            enc.encode("assistant", allowed_special=set())[0],
        ]


def test_ground_truths_are_correct_answers(df):
    for kind, question, truth in zip(df.dataset, df.question, df.ground_truth, strict=True):
        if kind == "aime25":
            a, b, c = map(int, re.search(r"a = (\d+) and b = (\d+)\. .* a\*b \+ (\d+)", question).groups())
            assert truth == str((a * b + c) % 1000)
        elif kind == "gpqa_diamond":
            a, b = map(int, re.search(r"What is (\d+) times (\d+)\?", question).groups())
            options = dict(re.findall(r"\(([ABCD])\) (\d+)", question))
            assert sorted(options) == ["A", "B", "C", "D"] and int(options[truth]) == a * b
        else:
            assert re.fullmatch(r"synthetic_lcb_\d{5}", truth)


def test_same_seed_same_data_and_exact_single_length():
    a, b = (
        make(3, prompt_len=(150, 150), output_len=(7, 7), seed=5),
        make(3, prompt_len=(150, 150), output_len=(7, 7), seed=5),
    )
    assert [x.tolist() for x in a.tok_input] == [x.tolist() for x in b.tok_input]
    assert set(a.tok_input_len) == {150} and set(a.max_output_len) == {7}


def test_cli_writes_a_dataset_the_harness_accepts(tmp_path, capsys):
    out = tmp_path / "s.parquet"
    assert main(["--out", str(out), "--rows", "4", "--prompt-len", "110:130", "--output-len", "0"]) == 0
    ds = load_dataset(out, require_ground_truth=True)
    assert len(ds) == 4 and ds.output_lens is None and ds.names == (*DATASETS, DATASETS[0])
    assert "wrote" in capsys.readouterr().out


def test_cli_refuses_a_prompt_shorter_than_the_question(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "s.parquet"), "--rows", "1", "--prompt-len", "20"])
    assert "prompt length 20 is shorter than the question's Harmony prompt" in capsys.readouterr().err


def test_bundled_sample_is_small_and_valid():
    path = Path(__file__).resolve().parents[2] / "data" / "sample.parquet"
    assert path.stat().st_size < 16 * 1024
    ds = load_dataset(path, require_ground_truth=True)
    assert len(ds) == 24 and set(ds.names) == set(DATASETS)
    assert ds.output_lens is not None and max(ds.output_lens) <= 32

"""Every bad dataset is refused before LoadGen starts, with a message naming the row and column."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pandas as pd
import pytest

from harness.dataset import DatasetError, check_model_limits, load_dataset
from tests.harness.runkit import run_cli

GOOD = [[200006, 17360, 200008], [200006, 1, 2, 3]]


def _write(tmp_path, name="d.parquet", **columns):
    df = pd.DataFrame(
        {"tok_input": GOOD, "dataset": ["aime25", "gpqa_diamond"], "ground_truth": ["7", "B"], **columns}
    )
    path = tmp_path / name
    df.to_parquet(path) if name.endswith(".parquet") else df.to_pickle(path)
    return path


def _error(path, **kw) -> str:
    with pytest.raises(DatasetError) as e:
        load_dataset(path, **kw)
    return str(e.value)


@pytest.mark.parametrize(
    "prompts, message",
    [
        ([[1, 2], []], "d.pkl: row 1, column 'tok_input' is an empty prompt"),
        ([[1, 2], [3, -4]], "d.pkl: row 1, column 'tok_input': token id -4 at position 1 is negative"),
        (
            [[1, 201088], [3]],
            "d.pkl: row 0, column 'tok_input': token id 201088 at position 1 is >= the vocabulary size "
            "201088",
        ),
        # ids past int64 (a list numpy keeps as objects): the same refusal, not an OverflowError
        (
            [[1, 2], [-(2**63) - 1]],
            "d.pkl: row 1, column 'tok_input': token id -9223372036854775809 at position 0 is negative",
        ),
        (
            [[1, 2**70]],
            "d.pkl: row 0, column 'tok_input': token id 1180591620717411303424 at position 1 is >= the "
            "vocabulary size 201088",
        ),
        (
            [[1, 2.5], [3]],
            "d.pkl: row 0, column 'tok_input': token at position 1 is 2.5 (float), not an integer id",
        ),
        (
            [[1, 2], [3, "x"]],
            "d.pkl: row 1, column 'tok_input': token at position 1 is 'x' (str), not an integer id",
        ),
        ([[1, 2], [3, float("nan")]], "d.pkl: row 1, column 'tok_input': token at position 1 is NaN"),
        ([[1, 2], None], "d.pkl: row 1, column 'tok_input' is NaN/missing, expected a list of token ids"),
        (
            [float("nan"), [1]],
            "d.pkl: row 0, column 'tok_input' is NaN/missing, expected a list of token ids",
        ),
        (["1 2 3", [1]], "d.pkl: row 0, column 'tok_input' is a str, expected a list of token ids"),
        (
            [[[1, 2]], [1]],
            "d.pkl: row 0, column 'tok_input' has shape (1, 2), expected a flat list of token ids",
        ),
        (  # found by test_bad_inputs_generated: numpy raised on the ragged nesting (a traceback)
            [[[0], [0, 0]], [1]],
            "d.pkl: row 0, column 'tok_input' is a ragged nested list, expected a flat list of token ids",
        ),
    ],
)
def test_bad_prompts_name_row_and_column(tmp_path, prompts, message):
    path = tmp_path / "d.pkl"
    pd.DataFrame({"tok_input": prompts}).to_pickle(path)
    assert _error(path) == message


def test_missing_prompt_column(tmp_path):
    path = tmp_path / "d.parquet"
    pd.DataFrame({"text": ["hi"], "dataset": ["aime25"]}).to_parquet(path)
    assert _error(path) == (
        f"dataset {path} has no 'tok_input' column (nor the older 'input_tokens'); its columns are: text, "
        "dataset"
    )


def test_older_input_tokens_column_is_accepted(tmp_path):
    path = tmp_path / "d.parquet"
    pd.DataFrame({"input_tokens": GOOD}).to_parquet(path)
    ds = load_dataset(path)
    assert ds.prompt_column == "input_tokens"
    assert [p.tolist() for p in ds.prompts] == GOOD
    assert ds.prompts[0].dtype == np.int32


def test_parquet_and_pickle_load_the_same(tmp_path):
    a = load_dataset(_write(tmp_path, "d.parquet", max_output_len=[5, 9]))
    b = load_dataset(_write(tmp_path, "d.pkl", max_output_len=[5, 9]))
    for ds in (a, b):
        assert [p.tolist() for p in ds.prompts] == GOOD
        assert ds.output_lens == (5, 9)
        assert ds.names == ("aime25", "gpqa_diamond")
        assert ds.has_ground_truth


def test_max_samples_takes_the_first_rows(tmp_path):
    ds = load_dataset(_write(tmp_path), max_samples=1)
    assert [p.tolist() for p in ds.prompts] == GOOD[:1]


@pytest.mark.parametrize(
    "column, values, message",
    [
        (
            "tok_input_len",
            [3, 5],
            "d.parquet: row 1, column 'tok_input_len' is 5 but 'tok_input' has 4 tokens",
        ),
        (
            "max_output_len",
            [8, 0],
            "d.parquet: row 1, column 'max_output_len' is 0, expected a positive integer",
        ),
        (
            "max_output_len",
            [8.0, float("nan")],
            "d.parquet: row 1, column 'max_output_len' is NaN/missing, expected a positive integer",
        ),
        (
            "max_output_len",
            [8.5, 2.0],
            "d.parquet: row 0, column 'max_output_len' is 8.5, expected a positive integer",
        ),
        (
            "dataset",
            [None, "gpqa_diamond"],
            "d.parquet: row 0, column 'dataset' is NaN/missing, expected a dataset name",
        ),
        ("dataset", [3, 4], "d.parquet: row 0, column 'dataset' is 3, expected a dataset name"),
    ],
)
def test_bad_side_columns(tmp_path, column, values, message):
    assert _error(_write(tmp_path, **{column: values})) == message


def test_nan_ground_truth_is_refused_when_accuracy_needs_it(tmp_path):
    path = _write(tmp_path, ground_truth=["7", None])
    load_dataset(path)  # performance runs do not read it
    assert _error(path, require_ground_truth=True) == "d.parquet: row 1, column 'ground_truth' is NaN/missing"


def test_prompt_longer_than_the_context_and_a_smaller_vocabulary(tmp_path):
    ds = load_dataset(_write(tmp_path))
    with pytest.raises(DatasetError) as e:
        check_model_limits(ds, max_model_len=4, vocab_size=201088)
    assert (
        str(e.value)
        == "d.parquet: row 1, column 'tok_input': the prompt has 4 tokens, longer than the model's context "
        "of 4 tokens"
    )
    with pytest.raises(DatasetError) as e:
        check_model_limits(ds, max_model_len=100, vocab_size=200000)
    assert str(e.value) == (
        "d.parquet: row 0, column 'tok_input': token id 200006 at position 0 is >= the model's vocabulary "
        "size 200000"
    )
    check_model_limits(ds, max_model_len=5, vocab_size=201088)


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("d.parquet", b"not a parquet file", "cannot read dataset {path}: ArrowInvalid:"),
        ("d.pkl", b"\x80\x04\x95", "cannot read dataset {path}: "),
        ("d.csv", b"a,b", "cannot read dataset {path}: expected a .parquet or .pkl file"),
        ("missing.parquet", None, "cannot read dataset {path}: no such file"),
    ],
)
def test_unreadable_files(tmp_path, name, content, message):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    assert _error(path).startswith(message.format(path=path))


def test_pickle_of_something_else(tmp_path):
    path = tmp_path / "d.pkl"
    path.write_bytes(pickle.dumps([1, 2, 3]))
    assert _error(path) == f"cannot read dataset {path}: expected a pandas DataFrame, found list"


class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_that_runs_code_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "d.pkl"
    path.write_bytes(pickle.dumps(pd.DataFrame({"tok_input": [[1, 2]], "x": [_Exploit(marker)]})))
    message = _error(path)
    assert message.startswith(f"refusing to load {path}: the pickle references posix.system")
    assert "convert the file to parquet" in message
    assert not marker.exists()


def test_bad_dataset_through_the_cli_exits_2_before_loadgen(fake_backend, tmp_path, capsys):
    path = tmp_path / "d.pkl"
    pd.DataFrame({"tok_input": [[1, 2], []]}).to_pickle(path)
    assert run_cli(["--backend", "fake", "--input-file", path, "--output-dir", tmp_path / "out"]) == 2
    assert "error: d.pkl: row 1, column 'tok_input' is an empty prompt" in capsys.readouterr().out
    assert not (tmp_path / "out").exists()  # nothing started, no logs
    assert fake_backend.LAST is None


def test_prompt_too_long_for_the_checkpoint_config(fake_backend, tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"max_position_embeddings": 3, "vocab_size": 201088}')
    path = _write(tmp_path)
    assert (
        run_cli(
            ["--backend", "fake", "--input-file", path, "--model-path", model, "--output-dir", tmp_path / "o"]
        )
        == 2
    )
    assert (
        "row 0, column 'tok_input': the prompt has 3 tokens, longer than the model's context of 3 tokens"
        in capsys.readouterr().out
    )

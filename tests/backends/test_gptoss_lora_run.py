"""run_mlperf.py --backend gptoss --lora: every query goes through the adapter, and the accuracy log
holds transformers + PEFT's greedy tokens for it (tiny checkpoint, float32); a bad adapter or a
second --lora stops the run before LoadGen starts (exit 2, one error line)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.backends.httpkit import accuracy_tokens, run_mlperf
from tests.gptoss.lorakit import hf_greedy, hf_model

pytest.importorskip("peft")
pytestmark = pytest.mark.timeout(600)
MAX_NEW = 8


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    from data.synthetic import make

    path = tmp_path_factory.mktemp("data") / "synth4.parquet"
    make(4, prompt_len=(110, 140), output_len=None, seed=4).to_parquet(path)
    return path


@pytest.fixture(scope="module")
def greedy_config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("conf") / "greedy.json"
    path.write_text(json.dumps({"temperature": 0.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": MAX_NEW}))
    return path


def prompts(path: Path) -> list[list[int]]:
    from harness.dataset import load_dataset

    return [p.tolist() for p in load_dataset(path).prompts]


def gptoss_flags(ckpt: Path, *more) -> list:
    # One sequence at a time: float32 greedy is then exact whatever the batch would be.
    return ["--backend", "gptoss", "--model-path", ckpt, "--device", "cpu", "--dtype", "float32",
            "--max-num-seqs", 1, "--kv-cache-tokens", 2048, *more]  # fmt: skip


def test_accuracy_log_holds_the_adapters_peft_tokens(
    tiny_checkpoint, tiny_loras, dataset, greedy_config, tmp_path
):
    proc = run_mlperf(
        *gptoss_flags(tiny_checkpoint, "--lora", tiny_loras[0]),
        "--scenario", "offline", "--accuracy", "--input-file", dataset, "--output-dir", tmp_path,
        "--generation-config", greedy_config,
    )  # fmt: skip
    # Random weights answer nothing right: every query succeeds, and accuracy FAILs (exit 1).
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    log_dir = tmp_path / "offline" / "accuracy"
    record = json.loads((log_dir / "run.json").read_text())
    assert record["failures"]["count"] == 0
    assert record["backend"]["lora"] == {tiny_loras[0].name: str(tiny_loras[0])}
    got = accuracy_tokens(log_dir)
    ps = prompts(dataset)
    assert got == dict(enumerate(hf_greedy(hf_model(tiny_checkpoint, tiny_loras[0]), ps, MAX_NEW, stop=True)))
    base = hf_greedy(hf_model(tiny_checkpoint), ps, MAX_NEW, stop=True)
    assert all(got[i] != b for i, b in enumerate(base))


@pytest.mark.parametrize(
    "lora, message",
    [
        (["--lora", "/nonexistent/adapter"], "LoRA adapter /nonexistent/adapter: no such folder"),
        (
            ["--lora", "a=/x", "--lora", "b=/y"],
            "--lora is given 2 times: run_mlperf sends every query through one adapter",
        ),
    ],
)
def test_bad_lora_stops_before_loadgen(tiny_checkpoint, dataset, tmp_path, lora, message):
    proc = run_mlperf(*gptoss_flags(tiny_checkpoint, *lora), "--scenario", "offline", "--input-file", dataset,
                      "--output-dir", tmp_path)  # fmt: skip
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert message in " ".join((proc.stdout + proc.stderr).split())
    assert not (tmp_path / "offline" / "performance" / "mlperf_log_summary.txt").exists()

"""The quick start: `python run_mlperf.py --scenario offline` with nothing else given runs the
gptoss engine on the tiny random checkpoint and the bundled data, VALID, on CPU."""

from __future__ import annotations

import json

import pytest

from tests.harness.runkit import ROOT, run_quick_start


@pytest.mark.timeout(240)
def test_quick_start_offline_run_is_valid(tmp_path):
    done = run_quick_start(tmp_path, "--scenario", "offline")
    assert done.returncode == 0, done.stdout + done.stderr
    log_dir = tmp_path / "out" / "offline" / "performance"
    assert "Result is : VALID" in (log_dir / "mlperf_log_summary.txt").read_text()
    record = json.loads((log_dir / "run.json").read_text())
    assert record["config"]["backend"] == "gptoss"
    assert (record["queries"]["issued"], record["queries"]["completed"]) == (24, 24)
    assert record["failures"]["count"] == 0
    # each bundled row once (equal-issue mode), each asking for an exact output length (ignore_eos)
    from harness.dataset import load_dataset

    assert record["queries"]["output_tokens"] == sum(
        load_dataset(ROOT / "data" / "sample.parquet").output_lens
    )
    assert "VALID" in done.stdout


@pytest.mark.timeout(240)
def test_max_model_len_shorter_than_the_prompts_fails_before_loadgen_citing_it(tmp_path):
    """The gptoss engine's own limit (the Backend protocol's max_model_len), not the checkpoint's 131072."""
    done = run_quick_start(tmp_path, "--max-model-len", "150", "--kv-cache-tokens", "4096")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stdout.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "longer than the model's context of 150 tokens" in errors[0], done.stdout
    log_dir = tmp_path / "out" / "offline" / "performance"
    assert not (log_dir / "mlperf_log_summary.txt").exists()  # LoadGen never started
    assert json.loads((log_dir / "run.json").read_text())["status"] == "error"

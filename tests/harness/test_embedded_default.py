"""The quick start: `python run_mlperf.py --scenario offline` with nothing else given runs the
gptoss engine on the tiny random checkpoint and the bundled data, VALID, on CPU."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

needs_engine = pytest.mark.skipif(
    importlib.util.find_spec("gptoss") is None
    or importlib.util.find_spec("gptoss.default") is None
    or not (ROOT / "backends" / "gptoss.py").is_file(),
    reason="the gptoss engine (gptoss/default.py, backends/gptoss.py) is not in this checkout",
)


@needs_engine
@pytest.mark.timeout(240)
def test_quick_start_offline_run_is_valid(tmp_path):
    env = dict(os.environ, MLPERF_DATA_DIR=str(tmp_path / "cache"), OMP_NUM_THREADS="2")
    env.pop("MLPERF_BACKEND", None)
    done = subprocess.run(
        [sys.executable, "run_mlperf.py", "--scenario", "offline", "--output-dir", str(tmp_path / "out")],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=230,  # a hang; how fast the quick start is belongs in the README's benchmarks
    )
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

"""Ctrl-C in the middle of a run: outstanding queries are completed, logs flushed, exit code 130."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.dataset import load_dataset
from tests.harness.runkit import accuracy_entries

ROOT = Path(__file__).resolve().parents[2]
FAKE_RUN = ROOT / "tests" / "harness" / "fake_run.py"


def _start(args: list) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(FAKE_RUN), "--backend", "fake", *map(str, args)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_streaming(proc: subprocess.Popen, mark: Path, requests: int, deadline_s: float = 60) -> None:
    """Until `requests` requests have yielded their first tokens (the fake writes a line for each)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        assert proc.poll() is None, proc.communicate()[0]
        if mark.is_file() and len(mark.read_text().splitlines()) >= requests:
            return
        time.sleep(0.05)
    raise AssertionError(f"{requests} requests never streamed")


@pytest.mark.timeout(90)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_in_offline_completes_outstanding_queries_and_flushes_logs(synth_parquet, tmp_path, sig):
    log_dir = tmp_path / "offline" / "accuracy"
    mark = tmp_path / "streaming"
    # Every request streams two tokens, then stalls for ever: at the signal all 16 are outstanding.
    proc = _start(
        [
            "--input-file",
            synth_parquet,
            "--accuracy",
            "--output-dir",
            tmp_path,
            "--fake-chunk",
            1,
            "--fake-stall-every",
            1,
            "--fake-fail-at",
            2,
            "--fake-mark-file",
            mark,
        ]
    )
    _wait_streaming(proc, mark, 16)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, out  # 130 for Ctrl-C, 143 for SIGTERM
    assert f"{sig.name}: cancelling 16 outstanding queries" in out
    # LoadGen finished normally: the accuracy log is complete JSON with every query, each
    # holding a real prefix of its output.
    entries = accuracy_entries(log_dir)
    assert sorted(e["qsl_idx"] for e in entries) == list(range(16))
    ds = load_dataset(synth_parquet)
    from harness.generation import load_sampling
    from harness.runner import sample_params
    from tests.harness.fakes import expected_tokens

    params = sample_params(load_sampling(None, accuracy=True), ds)
    for e in entries:
        full = expected_tokens(ds.prompts[e["qsl_idx"]].tolist(), params[e["qsl_idx"]])
        assert e["tokens"] == full[:2] and len(full) > 2
    assert (log_dir / "mlperf_log_summary.txt").is_file()
    record = json.loads((log_dir / "run.json").read_text())
    assert record["status"] == "interrupted" and record["exit_code"] == 128 + sig
    assert record["failures"]["reasons"] == {f"interrupted by {sig.name}": 16}


@pytest.mark.timeout(90)
def test_ctrl_c_in_server_exits_after_the_grace_period(synth_parquet, tmp_path):
    # LoadGen has no abort: with 300 s of schedule left it would keep issuing; we wait the grace
    # period, write our record and leave.
    log_dir = tmp_path / "server" / "performance"
    mark = tmp_path / "streaming"
    proc = _start(
        [
            "--scenario",
            "server",
            "--input-file",
            synth_parquet,
            "--output-dir",
            tmp_path,
            "--target-qps",
            20,
            "--min-duration",
            300,
            "--fake-delay",
            0.3,
            "--interrupt-grace",
            2,
            "--fake-mark-file",
            mark,
        ]
    )
    _wait_streaming(proc, mark, 1)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)  # far less than the 300 s LoadGen would still run
    elapsed = time.monotonic() - t0
    assert proc.returncode == 130, out
    assert elapsed >= 2  # the grace was given
    assert "exiting without LoadGen's final logs" in out
    record = json.loads((log_dir / "run.json").read_text())
    assert record["status"] == "interrupted" and record["exit_code"] == 130
    assert "incomplete" in record["note"]
    reasons = record["failures"]["reasons"]
    assert reasons.get("interrupted by SIGINT", 0) >= 1  # the queries in flight at Ctrl-C
    assert reasons.get("interrupted before it was sent", 0) >= 1  # LoadGen's schedule during the grace
    assert record["queries"]["issued"] == record["queries"]["completed"]


@pytest.mark.timeout(90)
def test_second_ctrl_c_exits_at_once(synth_parquet, tmp_path):
    log_dir = tmp_path / "server" / "performance"
    mark = tmp_path / "streaming"
    proc = _start(
        [
            "--scenario",
            "server",
            "--input-file",
            synth_parquet,
            "--output-dir",
            tmp_path,
            "--target-qps",
            20,
            "--min-duration",
            300,
            "--interrupt-grace",
            600,
            "--fake-mark-file",
            mark,
        ]
    )
    _wait_streaming(proc, mark, 1)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)  # not the 600 s grace
    assert proc.returncode == 130, out
    assert json.loads((log_dir / "run.json").read_text())["status"] == "interrupted"

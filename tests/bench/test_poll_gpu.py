"""bench/poll_gpu.sh: a device call's poll of a detached chain fails at once where the chain's log is
missing (a fresh machine after an idle release), and otherwise waits for its pattern."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "poll_gpu.sh"


def _poll(log: Path, pattern: str, seconds: int, **kw) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    p = subprocess.run(
        ["bash", str(SCRIPT), str(log), pattern, str(seconds)], capture_output=True, text=True, **kw
    )
    return p, time.monotonic() - start


def test_a_missing_log_fails_at_once_and_says_why(tmp_path):
    p, took = _poll(tmp_path / "chain.log", "done", 60)
    assert p.returncode == 3 and took < 5
    assert f"no {tmp_path / 'chain.log'}: this machine did not start the chain" in p.stderr


def test_a_pattern_already_there_prints_the_log_tail(tmp_path):
    log = tmp_path / "chain.log"
    log.write_text("".join(f"line {i}\n" for i in range(50)) + "[12 s] done\n")
    p, _ = _poll(log, "done|FAILED", 60, env={"LINES": "3", "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0
    assert p.stdout.splitlines() == ["line 48", "line 49", "[12 s] done"]


def test_a_pattern_written_later_ends_the_wait(tmp_path):
    log = tmp_path / "chain.log"
    log.write_text("[0 s] tests\n")
    writer = subprocess.Popen(["bash", "-c", f"sleep 1.5; echo '[9 s] FAILED: tests' >> {log}"])
    p, took = _poll(log, "done|FAILED", 30)
    writer.wait()
    assert p.returncode == 0 and 1 <= took < 10
    assert p.stdout.splitlines()[-1] == "[9 s] FAILED: tests"


def test_no_pattern_in_time_exits_2_with_the_tail(tmp_path):
    log = tmp_path / "chain.log"
    log.write_text("[0 s] kernel table\n")
    p, took = _poll(log, "done", 1)
    assert p.returncode == 2 and took < 10
    assert p.stdout == "[0 s] kernel table\n"
    assert "no 'done' in" in p.stderr and "after 1 s" in p.stderr

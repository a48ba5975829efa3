"""Helpers of the bad-input tests: run `run_mlperf.py` in a process of its own, and the invariants of
every refusal (exit 2, one `error:` line naming the problem, no traceback, no wait)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = str(ROOT / "data" / "sample.parquet")
WALL_S = 60.0  # each run, start to exit: a mistake never waits (a slow CPU still fits easily)


def frame(**columns) -> pd.DataFrame:
    base = {
        "tok_input": [[200006, 17360, 200008, 13225, 2375]] * 2,
        "tok_input_len": [5, 5],
        "dataset": ["gpqa_diamond", "aime25"],
        "ground_truth": ["A", "7"],
        "max_output_len": [4, 4],
    }
    base.update(columns)
    return pd.DataFrame({k: v for k, v in base.items() if v is not None})


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True, slots=True)
class Outcome:
    code: int
    stdout: str
    stderr: str
    wall_s: float

    @property
    def error_lines(self) -> list[str]:
        return [
            line for line in (self.stdout + "\n" + self.stderr).splitlines() if line.startswith("error: ")
        ]


def run_mlperf(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> Outcome:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200", **(env or {})}
    env.pop("MLPERF_BACKEND", None)
    env.pop("TRITON_INTERPRET", None)  # the kernel tests' conftest sets it in this process
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "run_mlperf.py"), *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=WALL_S,
    )
    return Outcome(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - t0)


def assert_refused(out: Outcome, code: int, check: str) -> None:
    """The invariants of every bad input."""
    shown = f"exit {out.code}\n--- stdout\n{out.stdout[-3000:]}\n--- stderr\n{out.stderr[-3000:]}"
    assert "Traceback" not in out.stderr and "Traceback" not in out.stdout, shown
    assert out.code == code, shown
    assert len(out.error_lines) == 1, shown
    assert re.search(check, out.error_lines[0]), f"{check!r} not in {out.error_lines[0]!r}"
    assert out.wall_s < WALL_S

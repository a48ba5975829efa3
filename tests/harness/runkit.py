"""Helpers of the harness tests: run the CLI in this process and read what the run wrote."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np


def run_cli(args: list[str]) -> int:
    from harness.cli import main

    return main(["run_mlperf.py", *map(str, args)])


def parse_cli(argv: list, env: dict | None = None, monkeypatch=None):
    """The RunConfig of `run_mlperf.py ARGV`; with monkeypatch, MLPERF_BACKEND unset and env set first."""
    from harness.cli import parse_config

    if monkeypatch is not None:
        monkeypatch.delenv("MLPERF_BACKEND", raising=False)
        for k, v in (env or {}).items():
            monkeypatch.setenv(k, v)
    return parse_config(["run_mlperf.py", *map(str, argv)])


ROOT = Path(__file__).resolve().parents[2]


def run_quick_start(tmp_path: Path, *args: object) -> subprocess.CompletedProcess:
    """`python run_mlperf.py ARGS --output-dir TMP/out` in a fresh process, as the quick start runs it
    (the gptoss engine by default, no MLPERF_BACKEND, a private data cache); a hang fails at 230 s."""
    env = dict(os.environ, MLPERF_DATA_DIR=str(tmp_path / "cache"), OMP_NUM_THREADS="2")
    env.pop("MLPERF_BACKEND", None)
    return subprocess.run(
        [sys.executable, "run_mlperf.py", *map(str, args), "--output-dir", str(tmp_path / "out")],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=230,  # a hang; how fast the quick start is belongs in the README's benchmarks
    )


def run_server_p90(tmp_path: Path, input_file: Path, *extra: object) -> int:
    """A Server run of the fake backend judged at p90 (LoadGen's early stopping needs 459 queries for
    a VALID p99 run, 44 at p90), min_duration 0, 48 queries; extra flags appended."""
    conf = tmp_path / "user.conf"
    conf.write_text("*.Server.target_latency_percentile = 90\n")
    return run_cli(
        ["--backend", "fake", "--scenario", "server", "--input-file", input_file, "--output-dir", tmp_path]
        + ["--min-duration", 0, "--min-query-count", 48, "--user-conf", conf, *extra]
    )


def accuracy_entries(log_dir: Path) -> list[dict]:
    """mlperf_log_accuracy.json with 'tokens' (and 'first', in Server mode) decoded from hex int32."""
    entries = json.loads((log_dir / "mlperf_log_accuracy.json").read_text())
    for e in entries:
        e["tokens"] = np.frombuffer(bytes.fromhex(e["data"]), dtype="<i4").tolist()
        if "token_data" in e:
            e["first"] = np.frombuffer(bytes.fromhex(e["token_data"]), dtype="<i4").tolist()
    return entries


def summary_field(log_dir: Path, name: str) -> str:
    text = (log_dir / "mlperf_log_summary.txt").read_text()
    m = re.search(rf"^{re.escape(name)}\s*:\s*(.+)$", text, re.MULTILINE)
    assert m, f"{name!r} not in the summary"
    return m.group(1).strip()


def detail_values(log_dir: Path) -> dict:
    from harness.report import read_detail

    return read_detail(log_dir).values


def run_json(log_dir: Path) -> dict:
    return json.loads((log_dir / "run.json").read_text())

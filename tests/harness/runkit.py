"""Helpers of the harness tests: run the CLI in this process and read what the run wrote."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np


def run_cli(args: list[str]) -> int:
    from harness.cli import main

    return main(["run_mlperf.py", *map(str, args)])


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

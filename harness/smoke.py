"""The embedded default (no --input-file): the bundled sample and short LoadGen settings, a smoke run
of about a minute, not a submission.

Offline runs every bundled row once, which is VALID whatever the speed. Server and Interactive
keep the benchmark's latency limits (TTFT 3 s / TPOT 80 ms; TTFT 2 s / TPOT 15 ms) but judge them
at the 90th percentile instead of the 99th: LoadGen's early stopping needs 459 queries before a
p99 run can be VALID (44 at p90), which at a rate a 2-core CPU sustains with the tiny model is
many minutes. At p90, 120 queries tolerate up to four over the limit; the Server smoke run takes
about a minute and is VALID on a 2-core CPU, even a busy one. Interactive's 15 ms per token is about
one decode step of the tiny model on a CPU, so its smoke run says before it starts that it will
usually end INVALID.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

SMOKE_LATENCY_PERCENTILE = 0.90
# Measured on a 2-core CPU with the tiny checkpoint (bf16, about 21 output tokens per row): one
# decode step takes 10-15 ms alone and 30-60 ms with a few requests and other processes beside
# it; 2 queries/s keep about one request in flight, so TPOT p90 stays well under 80 ms.
SERVER = {"min_duration": 0.0, "min_query_count": 120, "target_qps": 2.0}
# Interactive's TPOT limit (15 ms) is about one decode step of the tiny model on a CPU (measured:
# p50 16 ms at 1 query/s on a busy 2-core machine): only a request that runs alone can hold it,
# hence 1 query/s, and the run is kept short (two passes over the rows, about 50 s).
INTERACTIVE = {"min_duration": 0.0, "min_query_count": 48, "target_qps": 1.0}


def smoke_settings(scenario: str, rows: int) -> dict[str, Any]:
    """LoadGen settings of the embedded default for `scenario` over the `rows` bundled rows."""
    if scenario == "offline":
        return {"min_duration": 0.0, "min_query_count": rows}
    base = SERVER if scenario == "server" else INTERACTIVE
    return {**base, "latency_percentile": SMOKE_LATENCY_PERCENTILE}


def smoke_notes(scenario: str, settings: dict[str, Any]) -> list[str]:
    """What the user is told before the run, so that its verdict is read for what it is."""
    shown = ", ".join(f"{k}={v:g}" for k, v in settings.items())
    notes = [
        f"embedded default: short LoadGen settings {shown} (a smoke test, not a valid submission setting)"
    ]
    if scenario != "offline" and "latency_percentile" in settings:
        notes.append(
            f"the TTFT/TPOT limits are judged at p{settings['latency_percentile'] * 100:g} instead of p99 so "
            "that about a hundred queries can be VALID; a submission needs p99, --min-query-count >= 459 "
            "and a --target-qps the backend sustains"
        )
    if scenario == "interactive":
        notes.append(
            "Interactive allows 15 ms per output token, about one decode step of the tiny model on a CPU: "
            "this run is VALID only on an otherwise idle machine and usually ends INVALID (exit 3) on a "
            "busy one; that verdict is about the CPU, not the harness (--scenario server is the smoke test "
            "that holds its limits here)"
        )
    return notes


def _bundled_sample() -> Path:
    import data

    return Path(data.__file__).with_name("sample.parquet")


def _rows(path: Path) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows


def embedded_default(ns: argparse.Namespace) -> tuple[Path, dict[str, float | int], list[str]]:
    """No --input-file: the bundled sample, plus short LoadGen settings for flags left unset
    (unless a user.conf says what the user wants)."""
    path = _bundled_sample()
    rows = _rows(path)
    notes = [f"no --input-file: using the bundled synthetic dataset {path} ({rows} rows)"]
    if ns.user_conf is not None:
        return path, {}, notes
    short = {k: v for k, v in smoke_settings(ns.scenario, rows).items() if getattr(ns, k, None) is None}
    if ns.qps_sweep:
        short.pop("target_qps", None)  # the sweep gives each run its own
    if short:
        notes += smoke_notes(ns.scenario, short)
    return path, short, notes

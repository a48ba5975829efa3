"""Per-query records: what the SUT saw of every query, written once as queries.parquet.

A record is one tuple appended when a query completes (the SUT's only per-query cost); the frame
is built once at the end of the run.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

FILE_NAME = "queries.parquet"

# One row per completed query. Times are seconds since the SUT was created (about when LoadGen
# started the test); first_token_s is NaN when no token came; tpot_s as LoadGen defines it,
# (completion - first token) / (tokens - 1), NaN below 2 tokens; error is the failure reason
# exactly as run.json counts it ("" for none), error_name its exception (or kind) alone.
COLUMNS = (
    "qsl_idx",
    "issued_s",
    "first_token_s",
    "completed_s",
    "output_tokens",
    "ttft_s",
    "tpot_s",
    "latency_s",
    "error",
    "error_name",
)


class QueryRecords:
    """Raw (qsl_idx, issued, first token, completed, tokens, reason) tuples in monotonic ns."""

    __slots__ = ("rows", "t0_ns")

    def __init__(self) -> None:
        self.t0_ns = time.monotonic_ns()
        self.rows: list[tuple[int, int, int, int, int, str | None]] = []

    def __len__(self) -> int:
        return len(self.rows)

    def frame(self) -> pd.DataFrame:
        n = len(self.rows)
        if n:
            idx, issued, first, done, tokens, reasons = zip(*self.rows, strict=True)
        else:
            idx = issued = first = done = tokens = reasons = ()
        t0 = self.t0_ns
        issued_s = (np.asarray(issued, dtype=np.int64) - t0) / 1e9
        first_ns = np.asarray(first, dtype=np.int64)
        first_s = np.where(first_ns > 0, (first_ns - t0) / 1e9, np.nan)  # 0: no token came
        done_s = (np.asarray(done, dtype=np.int64) - t0) / 1e9
        n_tok = np.asarray(tokens, dtype=np.int64)
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(n_tok > 1, (done_s - first_s) / (n_tok - 1), np.nan)
        error = [r or "" for r in reasons]
        df = pd.DataFrame(
            {
                "qsl_idx": np.asarray(idx, dtype=np.int64),
                "issued_s": issued_s,
                "first_token_s": first_s,
                "completed_s": done_s,
                "output_tokens": n_tok,
                "ttft_s": first_s - issued_s,
                "tpot_s": tpot,
                "latency_s": done_s - issued_s,
                "error": pd.Series(error, dtype="string"),
                "error_name": pd.Series([error_name(r) for r in error], dtype="string"),
            },
            columns=list(COLUMNS),
        )
        return df.sort_values("issued_s", kind="stable", ignore_index=True)

    def write(self, directory: Path) -> Path:
        path = Path(directory) / FILE_NAME
        tmp = path.with_name(path.name + ".tmp")
        self.frame().to_parquet(tmp, index=False)
        tmp.replace(path)
        return path


def error_name(reason: str) -> str:
    """'InjectedFailure: injected ...' -> 'InjectedFailure'; 'timeout: the query took ...' -> 'timeout'."""
    return reason.split(":", 1)[0].strip() if reason else ""


def read_queries(directory: Path) -> pd.DataFrame:
    return pd.read_parquet(Path(directory) / FILE_NAME)

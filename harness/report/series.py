"""Time series and distributions from queries.parquet: CDFs, output tokens/s, queries in flight."""

from __future__ import annotations

import numpy as np


def cdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted finite values, fraction of queries at or below each)."""
    x = np.sort(values[np.isfinite(values)])
    return x, np.arange(1, len(x) + 1) / max(len(x), 1)


def _ramps(starts: np.ndarray, slopes: np.ndarray, t: np.ndarray) -> np.ndarray:
    """sum_q slopes[q] * max(t - starts[q], 0) at each t, in O((Q + T) log Q)."""
    order = np.argsort(starts, kind="stable")
    s, r = starts[order], slopes[order]
    cum_r = np.concatenate(([0.0], np.cumsum(r)))
    cum_rs = np.concatenate(([0.0], np.cumsum(r * s)))
    k = np.searchsorted(s, t, side="right")  # queries started at or before t
    return cum_r[k] * t - cum_rs[k]


def tokens_until(first_s: np.ndarray, done_s: np.ndarray, tokens: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Output tokens produced by time t: a query's first token at first_s, the rest spread evenly
    until done_s (the SUT sees chunks, not each token's time). Queries with no token add nothing."""
    has = np.isfinite(first_s) & (tokens > 0)
    first, done, n = first_s[has], done_s[has], tokens[has].astype(np.float64)
    rest = n - 1
    span = done - first
    instant = span <= 0
    # Steps: every first token, and the whole output of a query that came in one piece.
    step_at = np.concatenate((first, first[instant]))
    step_n = np.concatenate((np.ones_like(first), rest[instant]))
    order = np.argsort(step_at, kind="stable")
    cum_steps = np.concatenate(([0.0], np.cumsum(step_n[order])))
    steps = cum_steps[np.searchsorted(step_at[order], t, side="right")]
    spread = ~instant
    slope = rest[spread] / span[spread]
    ramps = _ramps(first[spread], slope, t) - _ramps(done[spread], slope, t)
    return steps + ramps


def token_rate(
    first_s: np.ndarray, done_s: np.ndarray, tokens: np.ndarray, bins: int = 100
) -> tuple[np.ndarray, np.ndarray]:
    """(bin centres in s, output tokens/s in each bin) from 0 to the last completion."""
    end = float(np.nanmax(done_s)) if len(done_s) else 0.0
    edges = np.linspace(0.0, end if end > 0 else 1.0, bins + 1)
    produced = tokens_until(first_s, done_s, tokens, edges)
    return (edges[:-1] + edges[1:]) / 2, np.diff(produced) / np.diff(edges)


def in_flight(issued_s: np.ndarray, done_s: np.ndarray, points: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    """(times in s, queries issued and not yet completed at each)."""
    end = float(np.nanmax(done_s)) if len(done_s) else 0.0
    t = np.linspace(0.0, end if end > 0 else 1.0, points)
    issued = np.searchsorted(np.sort(issued_s), t, side="right")
    done = np.searchsorted(np.sort(done_s), t, side="right")
    return t, issued - done

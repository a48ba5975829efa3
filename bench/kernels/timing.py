"""Kernel timings as the engine runs kernels: GPU time of CUDA-graph replays, no host launch cost.

Eager `triton.testing.do_bench` times a small launch's Python wrapper, not its kernel: attention's
decode at batch 1 read 39.6 µs eagerly and 3.9 as graph replays on an H200 (bench/results v43).
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable

import torch
import triton

# The cases timed eagerly (their capture failed): their figures carry host time, so a table lists them.
EAGER: list[str] = []
# The peer calls that failed or could not be made: their rows have no peer time (or no check), so a
# table counts and lists them after it (report).
PEER_FAILED: list[str] = []
# Our own cases that failed (a tile that does not build, a check that does not hold): their rows say
# "failed", and report counts them and returns how many, for the bench to exit non-zero.
CASE_FAILED: list[str] = []


def _said(what: str, why: BaseException | str, into: list[str]) -> None:
    reason = f"{type(why).__name__}: {why}" if isinstance(why, BaseException) else why
    print(f"{what}: {reason}", file=sys.stderr)
    into.append(what)


def peer_failed(what: str, why: BaseException | str) -> None:
    """A peer's failure (an exception, or why it cannot run): said on stderr, counted in PEER_FAILED."""
    _said(what, why, PEER_FAILED)


def case_failed(what: str, why: BaseException | str) -> None:
    """One of our cases failed (an exception, or a check that did not hold): said on stderr, counted
    in CASE_FAILED."""
    _said(what, why, CASE_FAILED)


def report() -> int:
    """After a table: the cases timed eagerly, the peer failures and our failed cases, each counted and
    named. Returns the number of our failed cases (a bench exits non-zero on any)."""
    if EAGER:
        print(f"\n{len(EAGER)} case(s) timed eagerly, host time included: {', '.join(EAGER)}")
    if PEER_FAILED:
        print(f"\n{len(PEER_FAILED)} peer failure(s), no peer figure there: {', '.join(PEER_FAILED)}")
    if CASE_FAILED:
        print(f"\n{len(CASE_FAILED)} case(s) of ours failed: {', '.join(CASE_FAILED)}")
    return len(CASE_FAILED)


def graph_us(fn: Callable[[], object], calls: int = 20) -> float:
    """GPU microseconds per call of fn: the median of 5 samples of 10 replays of one CUDA graph holding
    `calls` back-to-back calls (no host launch cost, as the engine runs its kernels; L2 stays warm across
    the calls). Raises what the capture raises, with the capture ended and the current stream restored."""
    fn()  # compiles Triton kernels and makes buffers (attention's tickets) a capture must not allocate
    torch.cuda.synchronize()
    s = torch.cuda.Stream()  # torch's documented pattern: warm up on a side stream before capturing
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    stream = torch.cuda.current_stream()
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            for _ in range(calls):
                fn()
    except BaseException:
        torch.cuda.set_stream(stream)  # capture_end raising skips torch.cuda.graph's own stream restore
        raise
    for _ in range(3):
        g.replay()
    reps, samples = 10, []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            g.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / (reps * calls))
    return statistics.median(samples)


def timed_us(fn: Callable[[], object], what: str) -> float:
    """graph_us(fn), or where fn cannot be captured do_bench's eager median, flagged on stderr."""
    fn()  # a failing call is no capture failure: it reaches the caller (a peer's, its caller reports)
    torch.cuda.synchronize()
    try:
        return graph_us(fn)
    except Exception as e:  # noqa: BLE001 - a case that cannot be captured is still timed, eagerly, flagged
        torch.cuda.synchronize()
        print(f"{what}: timed eagerly, CUDA-graph capture failed: {type(e).__name__}: {e}", file=sys.stderr)
        EAGER.append(what)
        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


def print_table(title: str, columns: list[str], rows: list[str]) -> None:
    """A bench's closing table: its title, a markdown header of `columns`, then its rows."""
    print(f"\n{title}\n")
    print("| " + " | ".join(columns) + " |\n|" + "---|" * len(columns))
    print("\n".join(rows))

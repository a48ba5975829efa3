"""Kernel timings as the engine runs kernels: GPU time of CUDA-graph replays, no host launch cost.

Eager `triton.testing.do_bench` times a small launch's Python wrapper, not its kernel: attention's
decode at batch 1 read 39.6 µs eagerly and 3.9 as graph replays on an H200 (bench/results v43).

cold_us times one call with L2 emptied before it, for kernels whose bytes come from HBM in the engine
(the decode MoE's weights). do_bench empties L2 by zeroing 256 MB: the L2 is then full of dirty lines,
and the timed kernel's reads evict them, so HBM also takes up to an L2 of write-backs the kernel never
asked for. Between the engine's layers the L2 holds the last kernels' reads (weights, the KV cache):
clean lines, dropped for free. FLUSH "read" (the default) empties L2 that way, by reading the buffer;
"zero" is do_bench's way, for comparison with tables timed before 2026-12-05 (bench/results v73).
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable

import torch
import triton

# How cold_us empties L2 before each timed call (l2_flush): "read" or "zero". A bench's --flush sets it.
FLUSH = "read"
FLUSHES = ("read", "zero")
FLUSH_BYTES = 256 << 20  # five times the 50 MB L2 of an H100 / H200

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


def l2_flush(mode: str, buf: torch.Tensor) -> Callable[[], object]:
    """A call that empties L2 of anything a timed call could reuse, by streaming buf (int32, larger
    than L2): "read" reads it (a max: one word written), leaving clean lines; "zero" writes it, as
    triton.testing.do_bench does, leaving dirty lines that are written back during the next kernel."""
    if mode == "read":
        return buf.max
    if mode == "zero":
        return buf.zero_
    raise ValueError(f"flush must be one of {', '.join(FLUSHES)}, got {mode!r}")


_FLUSH_BUF: list[torch.Tensor] = []  # one buffer a process, made on first use


def cold_us(fn: Callable[[], object], flush: str | None = None, reps: int = 100, warmup: int = 10) -> float:
    """GPU microseconds of one call of fn with L2 emptied before it (l2_flush(flush or FLUSH)): the
    median over reps calls, each between two events after its flush (the flush's kernel keeps the
    GPU busy while the host queues fn, so a graph replay's launch is not timed)."""
    if not _FLUSH_BUF:
        _FLUSH_BUF.append(torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda"))
    clear = l2_flush(flush or FLUSH, _FLUSH_BUF[0])
    for _ in range(warmup):
        fn()
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)
    ]
    for start, end in events:
        clear()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events) * 1e3


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

"""Hopper's bulk L2 prefetch: a kernel asks for the weights it will stream before it may read them.

At batch 1 every weight-streaming kernel (the O projection, the decode MoE GEMMs) is short, ~10-20
µs, and reaches 55-65 % of HBM bandwidth: the first loads wait a full DRAM latency, the software
pipeline keeps only a few stages in flight per program, and the kernel before it (attention, the
routing) is latency-bound with HBM idle. `l2_prefetch` issues `cp.async.bulk.prefetch.L2` for a
program's whole slice of weights at once, fire and forget: no register, no shared memory, nothing to
wait for. Issued before `griddepcontrol.wait` in a PDL kernel (weights never depend on the previous
kernel's output), the stream starts while the previous kernel still runs; the program's own loads
then hit L2. A prefetch changes no value: a stale or wrong address only wastes bandwidth, so every
address is clamped into the tensor it names.

GPTOSS_PREFETCH=0 turns it off (A/B timing, escape hatch), a list of PARTS (comma or +) keeps those
only (GPTOSS_PREFETCH=gemv,down); the interpreter and pre-Hopper GPUs never emit it (`on`).
"""

from __future__ import annotations

import os

import triton
import triton.language as tl
from torch import Tensor

from gptoss.kernels import pdl

PARTS = ("gemv", "gate_up", "down")  # the kernels that prefetch: projections, decode MoE GEMMs


def _parts(value: str) -> frozenset[str]:
    if value in ("", "1"):
        return frozenset(PARTS)
    if value == "0":
        return frozenset()
    parts = frozenset(value.replace("+", ",").split(","))
    if not parts <= set(PARTS):
        raise ValueError(
            f"GPTOSS_PREFETCH={value!r}: expected 0, 1 or a list (comma or +) of {', '.join(PARTS)}"
        )
    return parts


ENABLED = _parts(os.environ.get("GPTOSS_PREFETCH", "1"))


def on(t: Tensor, part: str) -> bool:
    """Whether `part`'s kernel on t's device issues L2 prefetches now (Hopper or later, compiled,
    enabled)."""
    return part in ENABLED and pdl.compiled_on_hopper(t)


MAX_BYTES = tl.constexpr((1 << 20) - 16)  # one request's size field: 16-byte units in 16 bits (SASS UBLKPF)


@triton.jit
def l2_prefetch(ptr, nbytes):
    """Prefetch bytes [ptr, ptr + nbytes) into L2 as one bulk request from the program's first
    thread. ptr is 16-byte aligned; the tail past the last whole 16 bytes and anything past
    MAX_BYTES are left to the program's own loads. One thread, one request: the first version split
    a span over every thread (128 requests of ~2 KB a program, a uniform-register waterfall loop of
    128 turns) and cost more than it saved (batch 1: 366.8 against 387.9 tok/s without)."""
    size = tl.minimum((nbytes // 16) * 16, MAX_BYTES)
    addr = ptr.to(tl.pointer_type(tl.uint8)).to(tl.int64, bitcast=True)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .u32 t; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0; @p setp.gt.s32 p, $2, 0; "
        "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r",
        [addr, size],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )

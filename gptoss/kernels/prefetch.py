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

GPTOSS_PREFETCH=0 turns it off (A/B timing, escape hatch), a comma list of PARTS keeps those only
(GPTOSS_PREFETCH=gemv,down); the interpreter and pre-Hopper GPUs never emit it (`on`).
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
    parts = frozenset(value.split(","))
    if not parts <= set(PARTS):
        raise ValueError(f"GPTOSS_PREFETCH={value!r}: expected 0, 1 or a comma list of {', '.join(PARTS)}")
    return parts


ENABLED = _parts(os.environ.get("GPTOSS_PREFETCH", "1"))


def on(t: Tensor, part: str) -> bool:
    """Whether `part`'s kernel on t's device issues L2 prefetches now (Hopper or later, compiled,
    enabled)."""
    return part in ENABLED and pdl.compiled_on_hopper(t)


@triton.jit
def l2_prefetch(ptr, nbytes, NT: tl.constexpr):
    """Prefetch bytes [ptr, ptr + nbytes) into L2, split over NT lanes (each one bulk request of a
    16-byte multiple). ptr is 16-byte aligned; nbytes a multiple of 16 (the tail past the last whole
    16 bytes is left to the program's own loads)."""
    base = ptr.to(tl.pointer_type(tl.uint8))
    chunk = tl.cdiv(nbytes // 16, NT) * 16
    start = tl.arange(0, NT) * chunk  # [NT]
    size = tl.minimum(chunk, (nbytes // 16) * 16 - start)  # [NT]; <= 0 past the end
    addr = (base + start).to(tl.int64, bitcast=True)  # [NT]
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.gt.s32 p, $2, 0; "
        "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r",
        [addr, size],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )

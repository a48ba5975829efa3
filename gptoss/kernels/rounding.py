"""Float32 -> storage dtype casts inside kernels, rounding to nearest even on every backend."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def round_to(x, dtype: tl.constexpr):
    """x float32 -> dtype; bf16 is rounded to nearest even by hand.

    GPUs round `x.to(tl.bfloat16)` to nearest even (cvt.rn), but Triton's CPU interpreter
    truncates, so kernels tested there against torch would be 1 ulp off half the time. The bit
    trick costs a few integer ops per element in kernels bound by memory, and it is exact: add
    0x7FFF plus the lowest kept bit, then drop the low 16 bits (inf stays inf; NaN stays a quiet NaN).
    """
    if dtype == tl.bfloat16:
        bits = rounded(x, dtype).to(tl.uint32, bitcast=True) >> 16  # the low 16 bits are zero
        bits = tl.where(x != x, 0x7FC0, bits)  # noqa: PLR0124 (NaN test: a payload in the low bits only)
        return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(dtype)


@triton.jit
def rounded(x, dtype: tl.constexpr):
    """x float32 rounded to dtype's precision (nearest even), kept in float32: for a value used again
    in the kernel. (The interpreter mis-reads arithmetic on round_to's bitcast bf16; a float32 that
    holds a bf16 value converts to bf16 exactly, by truncation or not.)"""
    if dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return tl.where(x != x, x, bits.to(tl.float32, bitcast=True))  # noqa: PLR0124 (NaN test)
    else:
        return x.to(dtype).to(tl.float32)

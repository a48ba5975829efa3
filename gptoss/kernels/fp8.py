"""The Triton side of the float8 KV cache (gptoss.kv_dtype): the rounding every writer uses.

A cached K or V element must be the bytes the torch reference stores, gptoss.kv_dtype.quantize:
the nearest e4m3fn value, ties to even, saturated at +-448. `e4m3_round` rounds with integer and
exact float32 steps rather than Triton's own conversion, because Triton 3.6's interpreter (the CPU
tests) rounds float32 -> float8e4nv otherwise than the GPU and torch (it is exact only for values
e4m3 holds, which is all e4m3_round hands it). Reads need nothing of this module: float8e4nv ->
float32 is exact in both. Attention also rounds this step's own keys and values (read from k/v,
not the cache) so that every key it sees is the stored one.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def e4m3_round(x):
    """float32 x -> the nearest e4m3fn value as float32 (ties to even, saturating at +-448)."""
    x = tl.minimum(tl.maximum(x, -448.0), 448.0)
    bits = x.to(tl.int32, bitcast=True)
    a = bits & 0x7FFFFFFF  # |x|'s bits
    # From 2^-6 (e4m3's least normal, float32 bits 0x3C800000) e4m3 keeps 3 of float32's 23 mantissa
    # bits: drop 20 with ties to even; a carry runs into the exponent as it should.
    keep = a >> 20
    rest = a & 0xFFFFF
    up = (rest > 0x80000) | ((rest == 0x80000) & ((keep & 1) == 1))
    normal = ((keep + up.to(tl.int32)) << 20).to(tl.float32, bitcast=True)
    # Below it, multiples of 2^-9: |x| * 512 is exact, its integer part and fraction too.
    y = a.to(tl.float32, bitcast=True) * 512.0
    n = y.to(tl.int32)  # truncation: y >= 0
    frac = y - n.to(tl.float32)
    up2 = (frac > 0.5) | ((frac == 0.5) & ((n & 1) == 1))
    sub = (n + up2.to(tl.int32)).to(tl.float32) * 0.001953125
    r = tl.where(a >= 0x3C800000, normal, sub).to(tl.int32, bitcast=True)
    # x's sign bit put back as a bit (Triton's -r is 0 - r, which would make -0.0 of a small
    # negative x +0.0 where torch stores -0.0)
    return (r | (bits & -2147483648)).to(tl.float32, bitcast=True)


@triton.jit
def to_cache(x, KV_FP8: tl.constexpr, dtype: tl.constexpr):
    """x as the cache stores it: e4m3 (KV_FP8) or dtype."""
    if KV_FP8:
        r = e4m3_round(x.to(tl.float32)).to(tl.float8e4nv)
    else:
        r = x.to(dtype)
    return r


@triton.jit
def as_stored(x, KV_FP8: tl.constexpr):
    """This step's K or V tile as attention must see it: e4m3-rounded under KV_FP8, in x's dtype."""
    if KV_FP8:
        r = e4m3_round(x.to(tl.float32)).to(x.dtype)
    else:
        r = x
    return r

"""The Gumbel noise of the device draw (gptoss.kernels.sampling_draw): a counter-based hash RNG, the
noise it gives, and an upper bound on that noise that needs no log (the draw's screen).

u_i = hash(seed, offset, i) is 32 random bits, w = (u + 0.5) / 2^32 in (0, 1], and E = -log(1 - w)
(a series for small w, where 1 - w would lose the digits that matter): float32 keeps w's relative
precision near 0, so the smallest E (the winners) are exact to ~1e-7 relative down to E ~ 1e-10;
w rounding to 1 gives E = inf, i.e. g = -inf, a token that cannot win (odds ~2^-25, harmless). The
hash is two rounds of Wellons' lowbias32 over the vocab index keyed by (seed, offset); it is a
bijection of the index for a fixed key, so draws in a row never collide.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _mix(x):
    """lowbias32 (Chris Wellons' hash-prospector): a bijective 32-bit integer hash."""
    x ^= x >> 16
    x *= 0x7FEB352D
    x ^= x >> 15
    x *= 0x846CA68B
    x ^= x >> 16
    return x


@triton.jit
def _row_keys(seed_ptr, off_ptr, rows, rmask):
    """Two 32-bit keys per row from (seed, offset) int64: k0 from the seed, k1 from both."""
    seed = tl.load(seed_ptr + rows, mask=rmask, other=0)
    off = tl.load(off_ptr + rows, mask=rmask, other=0)
    seed_lo, seed_hi = (seed & 0xFFFFFFFF).to(tl.uint32), ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    off_lo, off_hi = (off & 0xFFFFFFFF).to(tl.uint32), ((off >> 32) & 0xFFFFFFFF).to(tl.uint32)
    k0 = _mix(_mix(seed_lo ^ 0x5BD1E995) ^ seed_hi)
    k1 = _mix(_mix(k0 ^ off_lo) ^ off_hi)
    return k0, k1


@triton.jit
def _uniform(idx, k0, k1):
    """w = (u + 0.5) / 2^32 in (0, 1] for vocab indices idx under the row keys."""
    h = _mix(_mix(idx.to(tl.uint32) * 0x9E3779B9 + k1) ^ k0)
    return (h.to(tl.float32) + 0.5) * 2.3283064365386963e-10


@triton.jit
def _gumbel(w):
    """g = -log(E) ~ Gumbel(0, 1), E = -log(1 - w) ~ Exp(1)."""
    # -log(1 - w): 4 terms of the series below 1/64 (relative error < 1e-8), a plain log above.
    series = w * (1.0 + w * (0.5 + w * (0.3333333333333333 + w * 0.25)))
    e = tl.where(w < 0.015625, series, -tl.log(1.0 - w))  # Exp(1)
    return -tl.log(e)


@triton.jit
def _gumbel_bound(w):
    """An upper bound on _gumbel(w) from w's float bits, no log: E >= w (series and log alike), so
    g <= -ln(w); w = 2^e (1 + f) has bits / 2^23 = 127 + e + f and log2(1 + f) >= f (concave,
    equal at 0 and 1), so -log2(w) <= 127 - bits / 2^23, at most 0.087 above it. The 1e-4 covers the
    roundings (the bits' conversion, ~2e-5 here; the logs' ulps in g, ~2e-6)."""
    bits = w.to(tl.int32, bitcast=True).to(tl.float32)
    return (127.0 - bits * 1.1920928955078125e-07) * 0.6931471805599453 + 1e-4

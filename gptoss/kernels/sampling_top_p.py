"""Top-p without sorting the vocabulary: each row's kept set found by a search over its values.

gptoss.sampler's top-p rule (no top-k) keeps the smallest prefix of the stable descending order whose
mass reaches top_p: a token stays while the mass strictly before it is below top_p. With G(t) the
softmax mass of the logits whose order key exceeds t (keys: the float32 bits made monotone, -0.0 as
+0.0), the last kept value tau is the one at the smallest key t* with G(t*) < top_p: every logit above
it stays, every one below goes, and of its ties the first `ties` by index stay, where the j-th (from 0)
stays while G(t*) + j * q < top_p (q: their common probability). So the answer is filter_cut's (tau,
cut) pair, which the draw applies as it reads (or sampling.apply_cut as a masked copy).

t* is found in the 2^32 keys by a 17-way search: each pass evaluates G at 16 keys spread over the
interval (lo, hi] that holds t* (G(lo) >= top_p > G(hi)), in one read of the row, and keeps the sub-
interval where G crosses top_p; 8 passes leave hi - lo = 1 and t* = hi. No sort, no atomics, a fixed
launch sequence (CUDA-graph safe, no host sync): every pass is one [B, chunks] launch writing partial
sums, whose programs first add the previous pass's partials of their row in a fixed order (each the
same sum, so none waits for another), so a row's answer depends on its own logits and the chunk size
alone. 12 launches in all: the row statistics, their sum, 8 passes, the tie counts, and the cut.
Rows with temperature 0, top_p >= 1, a NaN or no finite logit are left whole (tau -inf, cut V).

Against the sort (sampling_filter.mask_top_k_top_p) the kept set is the same up to float32 rounding
of the mass sums, which are added in another order: a row whose cumulative mass lands within ~1e-6 of
top_p at a token boundary may keep one token more or less. Cost: ~10 reads of the row (statistics, 8
passes, the ties; then one chunk for the cut) and 16 compares a logit a pass, against a [B, V] sort
and its passes.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from gptoss.kernels.sampling_filter import chunk_size, chunks_bound, nth_equal_in_chunks

_W = 16  # keys tried a pass: the interval shrinks 17-fold, so 8 passes cover 2^32 keys (17^8 > 2^32)
PASSES = 8
_BLOCK = 256  # elements a loop step of the tie count and the cut scan
# The search passes' (BLOCK, UNROLL, num_warps), read at each call: BLOCK logits a loop step
# ([BLOCK, _W] partial sums in registers), UNROLL loads of BLOCK issued before their compares.
# bench/kernels/top_p_gpu.py on an H200 (v66), the search's µs at B 1 / 64 / 256 / 1024: 256x1x4
# 48.4 / 730 / 1981 / 7516, 256x2x4 42.8 / 549 / 1605 / 6077 (the same cuts on every row: the same
# sums in the same order), 128x2x4 50.4 / 515 / 1604 / 5845 (a few rows cut one token apart: another
# order), 8 warps or 1024 wide slower at B >= 64. The passes wait on their loads: two in flight help.
PASS_TILE = (256, 2, 4)


@triton.jit
def _key(x):
    """float32 -> int32 whose order is the floats' (-0.0 and +0.0 alike; NaN excluded by the caller)."""
    b = tl.where(x == 0.0, 0, x.to(tl.int32, bitcast=True))
    return tl.where(b >= 0, b, b ^ 0x7FFFFFFF)


@triton.jit
def _row_params(temp_ptr, top_p_ptr, row):
    """(searched: temperature > 0 and top_p < 1, log2(e) / T)"""
    t = tl.load(temp_ptr + row)
    p = tl.load(top_p_ptr + row)
    searched = tl.where(t > 0, p < 1, False)  # not (t > 0) & (p < 1): the interpreter's 0-d & fails
    return searched, 1.4426950408889634 / tl.where(t > 0, t, 1.0)  # log2(e) / T


@triton.jit
def _stats_kernel(
    logits_ptr,
    stride_row,
    temp_ptr,
    top_p_ptr,
    pm_ptr,
    ps_ptr,
    pnan_ptr,
    V,
    n_chunks,
    CHUNK,
    BLOCK: tl.constexpr,
):
    """Chunk program_id(1) of row program_id(0) -> its max, sum of 2^((x - max) * scale), NaN seen."""
    row = tl.program_id(0).to(tl.int64)
    ch = tl.program_id(1)
    searched, scale = _row_params(temp_ptr, top_p_ptr, row)
    if searched:
        lanes = tl.arange(0, BLOCK)
        mx = tl.full([BLOCK], float("-inf"), tl.float32)
        sm = tl.zeros([BLOCK], tl.float32)
        nan = tl.zeros([BLOCK], tl.int32)
        end = tl.minimum(ch * CHUNK + CHUNK, V)
        for s in range(ch * CHUNK, end, BLOCK):
            x = tl.load(logits_ptr + row * stride_row + s + lanes, mask=s + lanes < end, other=float("-inf"))
            is_nan = x != x  # noqa: PLR0124 (NaN test)
            nan |= is_nan.to(tl.int32)
            x = tl.where(is_nan, float("-inf"), x)
            new = tl.maximum(mx, x)
            ref = tl.where(new > float("-inf"), new, 0.0)  # an all -inf lane so far: sums 0, no -inf - -inf
            sm = sm * tl.exp2((mx - ref) * scale) + tl.exp2((x - ref) * scale)
            mx = new
        cm = tl.max(mx, axis=0)
        cs = tl.sum(sm * tl.exp2((mx - tl.where(cm > float("-inf"), cm, 0.0)) * scale), axis=0)
        i = row * n_chunks + ch
        tl.store(pm_ptr + i, cm)
        tl.store(ps_ptr + i, cs)
        tl.store(pnan_ptr + i, tl.max(nan, axis=0))


@triton.jit
def _init_kernel(
    temp_ptr, top_p_ptr, pm_ptr, ps_ptr, pnan_ptr, m_ptr, thr_ptr, span_ptr, n_chunks, CHUNKS: tl.constexpr
):
    """A row's chunks -> its max m, the mass threshold top_p * sum(2^((x - m) * scale)), and the
    search interval (lo, hi] = (below every key, key(m)] at span_ptr; hi = lo marks a row left whole."""
    row = tl.program_id(0).to(tl.int64)
    searched, scale = _row_params(temp_ptr, top_p_ptr, row)
    c = tl.arange(0, CHUNKS)
    cm = c < n_chunks
    pm = tl.load(pm_ptr + row * n_chunks + c, mask=cm & searched, other=float("-inf"))
    ps = tl.load(ps_ptr + row * n_chunks + c, mask=cm & searched, other=0.0)
    nan = tl.max(tl.load(pnan_ptr + row * n_chunks + c, mask=cm & searched, other=0), axis=0)
    m = tl.max(pm, axis=0)
    searched = searched & (nan == 0) & (m > float("-inf"))
    m = tl.where(searched, m, 0.0)
    s = tl.sum(tl.where(pm > float("-inf"), ps * tl.exp2((pm - m) * scale), 0.0), axis=0)
    tl.store(m_ptr + row, m)
    tl.store(thr_ptr + row, tl.load(top_p_ptr + row) * s)
    lo = -2147483648  # below every non-NaN key (-inf's is -2139095041)
    tl.store(span_ptr + row * 2, lo)
    tl.store(span_ptr + row * 2 + 1, tl.where(searched, _key(m).to(tl.int64), lo))


@triton.jit
def _candidates(lo, hi, W: tl.constexpr):
    """W keys splitting (lo, hi] into W + 1 parts (int32: all lie in [lo, hi])."""
    j = tl.arange(0, W).to(tl.int64)
    return (lo + (hi - lo) * (j + 1) // (W + 1)).to(tl.int32)


@triton.jit
def _narrowed(thr_ptr, span_ptr, pg_ptr, row, n_chunks, CHUNKS: tl.constexpr, W: tl.constexpr):
    """A row's (lo, hi) after the pass that used span_ptr's interval and wrote pg_ptr's partial G:
    the sub-interval where G crosses the threshold (G falls as keys rise). Every program of the row
    computes it alike (the same loads, the same fixed-order sum), so none waits for another."""
    lo = tl.load(span_ptr + row * 2)
    hi = tl.load(span_ptr + row * 2 + 1)
    if hi - lo > 1:
        c = tl.arange(0, CHUNKS)[:, None]
        j = tl.arange(0, W)[None, :]
        pg = tl.load(pg_ptr + (row * n_chunks + c) * W + j, mask=c < n_chunks, other=0.0)  # [CHUNKS, W]
        cand = _candidates(lo, hi, W).to(tl.int64)
        reach = tl.sum(pg, axis=0) >= tl.load(thr_ptr + row)  # [W]
        lo, hi = tl.max(tl.where(reach, cand, lo), axis=0), tl.min(tl.where(reach, hi, cand), axis=0)
    return lo, hi


@triton.jit
def _mass_above(acc, x, c, m, scale):
    """acc [BLOCK, W] + each logit's mass 2^((x - m) * scale) where its key exceeds candidate c[W]."""
    e = tl.exp2((x - m) * scale)[:, None]  # 0 at -inf
    return acc + tl.where(_key(x)[:, None] > c, e, 0.0)


@triton.jit
def _pass_kernel(
    logits_ptr,
    stride_row,
    temp_ptr,
    top_p_ptr,
    m_ptr,
    thr_ptr,
    span_in,
    pg_in,
    span_out,
    pg_out,
    cnt_out,
    V,
    n_chunks,
    CHUNK,
    BLOCK: tl.constexpr,
    W: tl.constexpr,
    CHUNKS: tl.constexpr,
    MODE: tl.constexpr,
    UNROLL: tl.constexpr,
):
    """Chunk program_id(1) of a row. Its interval: span_in's as it is (MODE 0, the first pass), or
    narrowed here from the previous pass's (span_in, pg_in) (chunk 0 stores it to span_out). MODE
    0 / 1, while the row still searches: G at each of the W candidate keys of the interval, partial,
    to pg_out [B, n, W]. MODE 2 (after the last pass, t* = hi): G(t*) to pg_out [B, n] and the count
    of logits at key t* to cnt_out, partial."""
    row = tl.program_id(0).to(tl.int64)
    ch = tl.program_id(1)
    if MODE == 0:
        lo = tl.load(span_in + row * 2)
        hi = tl.load(span_in + row * 2 + 1)
    else:
        lo, hi = _narrowed(thr_ptr, span_in, pg_in, row, n_chunks, CHUNKS, W)
        if ch == 0:
            tl.store(span_out + row * 2, lo)
            tl.store(span_out + row * 2 + 1, hi)
    go = hi > lo if MODE == 2 else hi - lo > 1  # a key at t* to count; or a search not done
    if go:
        _, scale = _row_params(temp_ptr, top_p_ptr, row)
        m = tl.load(m_ptr + row)
        lanes = tl.arange(0, BLOCK)
        end = tl.minimum(ch * CHUNK + CHUNK, V)
        i = row * n_chunks + ch
        if MODE == 2:
            t = hi.to(tl.int32)
            g = tl.zeros([BLOCK], tl.float32)
            n = tl.zeros([BLOCK], tl.int32)
            for s in range(ch * CHUNK, end, BLOCK):
                x = tl.load(
                    logits_ptr + row * stride_row + s + lanes, mask=s + lanes < end, other=float("-inf")
                )
                k = _key(x)
                g += tl.where(k > t, tl.exp2((x - m) * scale), 0.0)
                n += ((k == t) & (s + lanes < end)).to(tl.int32)
            tl.store(pg_out + i, tl.sum(g, axis=0))
            tl.store(cnt_out + i, tl.sum(n, axis=0))
        else:
            c = _candidates(lo, hi, W)[None, :]  # [1, W]
            acc = tl.zeros([BLOCK, W], tl.float32)
            x_ptr = logits_ptr + row * stride_row
            for s in range(ch * CHUNK, end, BLOCK * UNROLL):
                # UNROLL loads issued before the compares: more bytes in flight a warp
                x = tl.load(x_ptr + s + lanes, mask=s + lanes < end, other=float("-inf"))
                if UNROLL == 2:
                    s2 = s + BLOCK + lanes
                    x2 = tl.load(x_ptr + s2, mask=s2 < end, other=float("-inf"))
                acc = _mass_above(acc, x, c, m, scale)
                if UNROLL == 2:
                    acc = _mass_above(acc, x2, c, m, scale)
            tl.store(pg_out + i * W + tl.arange(0, W), tl.sum(acc, axis=0))


@triton.jit
def _resolve_kernel(
    logits_ptr,
    stride_row,
    temp_ptr,
    top_p_ptr,
    m_ptr,
    thr_ptr,
    span_ptr,
    g_ptr,
    cnt_ptr,
    tau_ptr,
    cut_ptr,
    V,
    n_chunks,
    CHUNK,
    BLOCK: tl.constexpr,
    CHUNKS: tl.constexpr,
):
    """A row's t*, G(t*) and tie counts -> tau and cut: V when every tie stays (rows left whole: tau
    -inf), else the index of the last kept tie, found by a scan of the one chunk that holds it."""
    row = tl.program_id(0).to(tl.int64)
    lo = tl.load(span_ptr + row * 2)
    hi = tl.load(span_ptr + row * 2 + 1)
    c = tl.arange(0, CHUNKS)
    cm = (c < n_chunks) & (hi > lo)
    g = tl.sum(tl.load(g_ptr + row * n_chunks + c, mask=cm, other=0.0), axis=0)
    cnt_c = tl.load(cnt_ptr + row * n_chunks + c, mask=cm, other=0)
    cnt = tl.sum(cnt_c, axis=0)
    b = hi.to(tl.int32)
    tau = tl.where(b >= 0, b, b ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)
    _, scale = _row_params(temp_ptr, top_p_ptr, row)
    q = tl.exp2((tau - tl.load(m_ptr + row)) * scale)  # each tie's mass
    d = (tl.load(thr_ptr + row) - g) / tl.where(q > 0, q, 1.0)
    # tie j (from 0) stays while g + j * q < threshold: ceil(d) of them, at least the first
    ties = tl.where(q > 0, tl.minimum(tl.maximum(tl.ceil(d), 1.0), cnt.to(tl.float32)).to(tl.int32), cnt)
    whole = cnt == 0  # left whole (or no key at t*: the mass never reached top_p, so all stay)
    tl.store(tau_ptr + row, tl.where(whole, float("-inf"), tau))
    cut = V
    if ties < cnt:  # the last kept tie's index
        cut = nth_equal_in_chunks(logits_ptr + row * stride_row, tau, ties, cnt_c, V, CHUNK, BLOCK, CHUNKS)
    tl.store(cut_ptr + row, cut)


def top_p_cut(logits: Tensor, temperature: Tensor, top_p: Tensor, chunk: int = 0) -> tuple[Tensor, Tensor]:
    """logits [B, V] float32, temperature and top_p [B] float32 -> (tau [B] float32, cut [B] int32):
    the top-p rule's kept set on every row with temperature > 0 and top_p < 1, as filter_cut gives it
    (keep the logits above tau, those equal to it at an index <= cut, and NaN). Other rows: (-inf, V).
    chunk: logits a program of a pass (0: chunk_size's; tests pass small ones)."""
    b, v = logits.shape
    dev = logits.device
    tau = torch.empty(b, dtype=torch.float32, device=dev)
    cut = torch.empty(b, dtype=torch.int32, device=dev)
    if b == 0:
        return tau, cut
    chunk = chunk or chunk_size(b, v)
    if chunk & (chunk - 1):
        raise ValueError(f"chunk must be a power of two, got {chunk}")
    block = min(_BLOCK, triton.next_power_of_2(v), chunk)
    n = triton.cdiv(v, chunk)
    chunks = chunks_bound(v, chunk)
    f32 = dict(dtype=torch.float32, device=dev)
    pm, ps, pg = torch.empty(b, n, **f32), torch.empty(b, n, **f32), torch.empty(2, b, n, _W, **f32)
    pnan, cnt = (torch.empty(b, n, dtype=torch.int32, device=dev) for _ in range(2))
    m, thr, g = torch.empty(b, **f32), torch.empty(b, **f32), torch.empty(b, n, **f32)
    span = torch.empty(2, b, 2, dtype=torch.int64, device=dev)  # (lo, hi) of a row, two slots
    row = (logits, logits.stride(0))
    params = (temperature.contiguous(), top_p.contiguous())
    grid = (b, n)
    _stats_kernel[grid](
        *row, *params, pm, ps, pnan, v, n, chunk, BLOCK=min(1024, triton.next_power_of_2(chunk))
    )
    _init_kernel[(b,)](*params, pm, ps, pnan, m, thr, span[0], n, CHUNKS=chunks)
    pass_block, unroll, warps = PASS_TILE
    pass_block = min(pass_block, triton.next_power_of_2(v), chunk)
    consts = dict(BLOCK=pass_block, W=_W, CHUNKS=chunks, UNROLL=unroll, num_warps=warps)
    # pass i reads slot (i - 1) % 2 (the interval it narrows, the partials that narrow it) and writes
    # slot i % 2: no launch writes what its own programs read
    for i in range(PASSES + 1):  # the search's passes, then the ties' (MODE 2)
        mode = 0 if i == 0 else 1 if i < PASSES else 2
        span_in = span[0] if i == 0 else span[(i - 1) % 2]
        out = g if mode == 2 else pg[i % 2]
        args = (m, thr, span_in, pg[(i - 1) % 2], span[i % 2], out, cnt, v, n, chunk)
        _pass_kernel[grid](*row, *params, *args, MODE=mode, **consts)
    _resolve_kernel[(b,)](
        *row, *params, m, thr, span[PASSES % 2], g, cnt, tau, cut, v, n, chunk, BLOCK=block, CHUNKS=chunks
    )
    return tau, cut


assert (_W + 1) ** PASSES >= 2**32 and math.log2(_W) % 1 == 0

"""Paged attention with per-head sinks and sliding windows: one Triton kernel for prefill and decode."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from torch import Tensor

LOG2E = 1.4426950408889634
# Decode splits the keys of a (sequence, KV head) over several programs until about this many
# programs per SM run; a split keeps at least MIN_SPLIT_KEYS keys so its partials (16 rows of
# m, l and D floats, written then read back) stay small next to the K/V it reads (256 B a key).
PROGRAMS_PER_SM = 4
MIN_SPLIT_KEYS = 256
MAX_SPLITS = 64
# (BLOCK_N, num_warps, num_stages) per path; chosen by reasoning, not measured: the lead tunes them.
DECODE_CFG = (64, 4, 3)
PREFILL_CFG = (64, 8, 3)
PREFILL_ROWS = 128  # BLOCK_M of prefill: query tokens x padded GQA group
# Triton 3.6's interpreter multiplies the raw bits of bf16 dot operands; read when the kernels
# below are decorated, it makes them upcast dot operands (after the same bf16 rounding) there.
INTERPRETED = bool(triton.knobs.runtime.interpret)


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    if UPCAST:
        r = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        r = tl.dot(a, b, input_precision=PRECISION)
    return r


@triton.jit
def _tile(
    acc,
    m,
    l,
    q,
    qpos,
    s_idx,
    h,
    j,
    ps,
    pe,
    ctx,
    q0,
    window,
    ring_len,
    qk_scale,
    kc_ptr,
    vc_ptr,
    kn_ptr,
    vn_ptr,
    table_ptr,
    stride_nt,
    stride_nh,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_tb,
    D: tl.constexpr,
    BS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    FROM_CACHE: tl.constexpr,
    RING: tl.constexpr,
    WINDOWED: tl.constexpr,
    MASKED: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """One online-softmax step over keys [ps + j*BLOCK_N, +BLOCK_N) (log2 domain, float32)."""
    kp = ps + j * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN] key positions
    d = tl.arange(0, D)
    kv_ok = kp < pe
    if FROM_CACHE:
        if RING:
            slot = (kp // BS) % ring_len
        else:
            slot = kp // BS
        if MASKED:
            page = tl.load(table_ptr + s_idx * stride_tb + slot, mask=kv_ok, other=0)
        else:
            page = tl.load(table_ptr + s_idx * stride_tb + slot)
        off = page.to(tl.int64) * stride_cb + (kp % BS) * stride_cs + h * stride_ch  # [BN]
        k_ptrs = kc_ptr + off[:, None] + d[None, :]
        v_ptrs = vc_ptr + off[:, None] + d[None, :]
    else:
        off = (q0 + kp - ctx).to(tl.int64) * stride_nt + h * stride_nh  # this step's token rows
        k_ptrs = kn_ptr + off[:, None] + d[None, :]
        v_ptrs = vn_ptr + off[:, None] + d[None, :]
    if MASKED:
        k = tl.load(k_ptrs, mask=kv_ok[:, None], other=0.0)
    else:
        k = tl.load(k_ptrs)
    s = _dot(q, tl.trans(k), PRECISION, UPCAST) * qk_scale  # [BM, BN]
    if MASKED:
        seen = kv_ok[None, :] & (kp[None, :] <= qpos[:, None])
        if WINDOWED:
            seen = seen & (qpos[:, None] - kp[None, :] < window)
        s = tl.where(seen, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet
    alpha = tl.exp2(m - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l = l * alpha + tl.sum(p, 1)
    if MASKED:
        v = tl.load(v_ptrs, mask=kv_ok[:, None], other=0.0)
    else:
        v = tl.load(v_ptrs)
    acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, PRECISION, UPCAST)
    return acc, m_new, l


@triton.jit
def _phase(
    acc,
    m,
    l,
    q,
    qpos,
    q_first,
    q_last,
    s_idx,
    h,
    ps,
    pe,
    ctx,
    q0,
    window,
    ring_len,
    qk_scale,
    kc_ptr,
    vc_ptr,
    kn_ptr,
    vn_ptr,
    table_ptr,
    stride_nt,
    stride_nh,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_tb,
    D: tl.constexpr,
    BS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    FROM_CACHE: tl.constexpr,
    RING: tl.constexpr,
    WINDOWED: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Keys [ps, pe) in tiles from ps: masked tiles at the window's lower edge, unmasked tiles
    every row sees whole, masked tiles at the causal edge and the range's end."""
    span = tl.maximum(pe - ps, 0)
    n_tot = (span + BLOCK_N - 1) // BLOCK_N
    lo_all = ps  # first key every row of the tile sees (window edge)
    if WINDOWED:
        lo_all = tl.maximum(ps, q_last - window + 1)
    hi_all = tl.minimum(pe, q_first + 1)  # keys below it are causally visible to every row
    n_lead = tl.minimum(n_tot, (tl.maximum(lo_all - ps, 0) + BLOCK_N - 1) // BLOCK_N)
    n_mid = tl.maximum(tl.maximum(hi_all - ps, 0) // BLOCK_N - n_lead, 0)
    for j in range(0, n_lead):
        acc, m, l = _tile(
            acc,
            m,
            l,
            q,
            qpos,
            s_idx,
            h,
            j,
            ps,
            pe,
            ctx,
            q0,
            window,
            ring_len,
            qk_scale,
            kc_ptr,
            vc_ptr,
            kn_ptr,
            vn_ptr,
            table_ptr,
            stride_nt,
            stride_nh,
            stride_cb,
            stride_cs,
            stride_ch,
            stride_tb,
            D,
            BS,
            BLOCK_N,
            FROM_CACHE,
            RING,
            WINDOWED,
            True,
            PRECISION,
            UPCAST,
        )
    for j in range(n_lead, n_lead + n_mid):
        acc, m, l = _tile(
            acc,
            m,
            l,
            q,
            qpos,
            s_idx,
            h,
            j,
            ps,
            pe,
            ctx,
            q0,
            window,
            ring_len,
            qk_scale,
            kc_ptr,
            vc_ptr,
            kn_ptr,
            vn_ptr,
            table_ptr,
            stride_nt,
            stride_nh,
            stride_cb,
            stride_cs,
            stride_ch,
            stride_tb,
            D,
            BS,
            BLOCK_N,
            FROM_CACHE,
            RING,
            WINDOWED,
            False,
            PRECISION,
            UPCAST,
        )
    for j in range(n_lead + n_mid, n_tot):
        acc, m, l = _tile(
            acc,
            m,
            l,
            q,
            qpos,
            s_idx,
            h,
            j,
            ps,
            pe,
            ctx,
            q0,
            window,
            ring_len,
            qk_scale,
            kc_ptr,
            vc_ptr,
            kn_ptr,
            vn_ptr,
            table_ptr,
            stride_nt,
            stride_nh,
            stride_cb,
            stride_cs,
            stride_ch,
            stride_tb,
            D,
            BS,
            BLOCK_N,
            FROM_CACHE,
            RING,
            WINDOWED,
            True,
            PRECISION,
            UPCAST,
        )
    return acc, m, l


@triton.jit
def _attn_kernel(
    q_ptr,
    kn_ptr,
    vn_ptr,
    kc_ptr,
    vc_ptr,
    table_ptr,
    qstart_ptr,
    ctx_ptr,
    sink_ptr,
    out_ptr,
    pm_ptr,
    pl_ptr,
    pacc_ptr,
    qk_scale,
    window,
    ring_len,
    num_splits,
    hq,
    stride_qt,
    stride_qh,
    stride_nt,
    stride_nh,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_tb,
    stride_ot,
    stride_oh,
    G: tl.constexpr,
    G_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    D: tl.constexpr,
    BS: tl.constexpr,
    RING: tl.constexpr,
    WINDOWED: tl.constexpr,
    SPLIT: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Program (q tile x split, sequence, KV head): rows are BLOCK_Q tokens x G_PAD heads."""
    BM: tl.constexpr = BLOCK_Q * G_PAD
    pid0 = tl.program_id(0)
    s_idx = tl.program_id(1)
    h = tl.program_id(2)
    # Latest q tiles (longest causal key ranges) start first.
    tile = tl.num_programs(0) // num_splits - 1 - pid0 // num_splits
    split = pid0 % num_splits
    q0 = tl.load(qstart_ptr + s_idx)
    q_len = tl.load(qstart_ptr + s_idx + 1) - q0
    ctx = tl.load(ctx_ptr + s_idx)
    t0 = tile * BLOCK_Q
    if t0 >= q_len:
        return
    rows = tl.arange(0, BM)
    qi = rows // G_PAD
    g = rows % G_PAD
    row_ok = (t0 + qi < q_len) & (g < G)
    tok = (q0 + t0 + qi).to(tl.int64)
    head = h * G + g
    qpos = ctx + t0 + qi  # [BM] absolute positions
    q_first = ctx + t0
    q_last = ctx + tl.minimum(t0 + BLOCK_Q, q_len) - 1
    d = tl.arange(0, D)
    q = tl.load(
        q_ptr + tok[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
        mask=row_ok[:, None],
        other=0.0,
    )
    lo = 0
    if WINDOWED:
        lo = tl.maximum(q_first - window + 1, 0)  # keys below are outside every row's window
    hi = q_last + 1
    if SPLIT:
        chunk = ((hi - lo + num_splits - 1) // num_splits + BLOCK_N - 1) // BLOCK_N * BLOCK_N
        lo = lo + split * chunk
        hi = tl.minimum(hi, lo + chunk)  # empty for late splits: neutral partials below
    m = tl.full([BM], float("-inf"), tl.float32)
    l = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    # Context keys (positions < ctx) come from the cache, this step's keys from k_new/v_new.
    acc, m, l = _phase(
        acc,
        m,
        l,
        q,
        qpos,
        q_first,
        q_last,
        s_idx,
        h,
        lo,
        tl.minimum(hi, ctx),
        ctx,
        q0,
        window,
        ring_len,
        qk_scale,
        kc_ptr,
        vc_ptr,
        kn_ptr,
        vn_ptr,
        table_ptr,
        stride_nt,
        stride_nh,
        stride_cb,
        stride_cs,
        stride_ch,
        stride_tb,
        D,
        BS,
        BLOCK_N,
        True,
        RING,
        WINDOWED,
        PRECISION,
        UPCAST,
    )
    acc, m, l = _phase(
        acc,
        m,
        l,
        q,
        qpos,
        q_first,
        q_last,
        s_idx,
        h,
        tl.maximum(lo, ctx),
        hi,
        ctx,
        q0,
        window,
        ring_len,
        qk_scale,
        kc_ptr,
        vc_ptr,
        kn_ptr,
        vn_ptr,
        table_ptr,
        stride_nt,
        stride_nh,
        stride_cb,
        stride_cs,
        stride_ch,
        stride_tb,
        D,
        BS,
        BLOCK_N,
        False,
        RING,
        WINDOWED,
        PRECISION,
        UPCAST,
    )
    if SPLIT:
        part = (s_idx * hq + head) * num_splits + split  # [BM]
        tl.store(pm_ptr + part, m, mask=row_ok)
        tl.store(pl_ptr + part, l, mask=row_ok)
        tl.store(pacc_ptr + part[:, None] * D + d[None, :], acc, mask=row_ok[:, None])
    else:
        sink = tl.load(sink_ptr + head, mask=g < G, other=float("-inf")) * 1.4426950408889634
        m_f = tl.maximum(m, sink)
        m_f = tl.where(m_f == float("-inf"), 0.0, m_f)
        alpha = tl.exp2(m - m_f)
        den = l * alpha + tl.exp2(sink - m_f)
        o = acc * (alpha / tl.where(den == 0.0, 1.0, den))[:, None]
        tl.store(
            out_ptr + tok[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
            o.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None],
        )


@triton.jit
def _reduce_kernel(
    qstart_ptr,
    sink_ptr,
    out_ptr,
    pm_ptr,
    pl_ptr,
    pacc_ptr,
    num_splits,
    hq,
    stride_ot,
    stride_oh,
    G: tl.constexpr,
    G_PAD: tl.constexpr,
    NS_PAD: tl.constexpr,
    D: tl.constexpr,
):
    """Program (sequence, KV head): merges the split partials of the group's heads with the sink."""
    s_idx = tl.program_id(0)
    h = tl.program_id(1)
    q0 = tl.load(qstart_ptr + s_idx)
    if tl.load(qstart_ptr + s_idx + 1) == q0:
        return
    g = tl.arange(0, G_PAD)
    ok = g < G
    head = h * G + g
    base = (s_idx * hq + head) * num_splits  # [G_PAD]
    sp = tl.arange(0, NS_PAD)
    pmask = ok[:, None] & (sp[None, :] < num_splits)
    ms = tl.load(pm_ptr + base[:, None] + sp[None, :], mask=pmask, other=float("-inf"))
    ls = tl.load(pl_ptr + base[:, None] + sp[None, :], mask=pmask, other=0.0)
    sink = tl.load(sink_ptr + head, mask=ok, other=float("-inf")) * 1.4426950408889634
    m_f = tl.maximum(tl.max(ms, 1), sink)
    m_f = tl.where(m_f == float("-inf"), 0.0, m_f)
    den = tl.sum(ls * tl.exp2(ms - m_f[:, None]), 1) + tl.exp2(sink - m_f)
    d = tl.arange(0, D)
    acc = tl.zeros([G_PAD, D], tl.float32)
    for i in range(0, num_splits):
        m_i = tl.load(pm_ptr + base + i, mask=ok, other=float("-inf"))
        a_i = tl.load(pacc_ptr + (base + i)[:, None] * D + d[None, :], mask=ok[:, None], other=0.0)
        acc += a_i * tl.exp2(m_i - m_f)[:, None]
    o = acc / tl.where(den == 0.0, 1.0, den)[:, None]
    tl.store(
        out_ptr + q0.to(tl.int64) * stride_ot + head[:, None] * stride_oh + d[None, :],
        o.to(out_ptr.dtype.element_ty),
        mask=ok[:, None],
    )


@triton.jit
def _write_kv_kernel(
    kn_ptr,
    vn_ptr,
    kc_ptr,
    vc_ptr,
    slot_ptr,
    stride_nt,
    stride_nh,
    stride_cb,
    stride_cs,
    stride_ch,
    HKV: tl.constexpr,
    H_PAD: tl.constexpr,
    D: tl.constexpr,
    BS: tl.constexpr,
):
    """Program t: copies token t's [Hkv, D] K and V into its cache slot, unless the slot is -1."""
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t)
    if slot < 0:
        return
    hh = tl.arange(0, H_PAD)[:, None]
    d = tl.arange(0, D)[None, :]
    mask = hh < HKV
    src = t.to(tl.int64) * stride_nt + hh * stride_nh + d
    dst = (slot // BS) * stride_cb + (slot % BS) * stride_cs + hh * stride_ch + d
    tl.store(kc_ptr + dst, tl.load(kn_ptr + src, mask=mask).to(kc_ptr.dtype.element_ty), mask=mask)
    tl.store(vc_ptr + dst, tl.load(vn_ptr + src, mask=mask).to(vc_ptr.dtype.element_ty), mask=mask)


@functools.cache
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def decode_splits(num_seqs: int, num_kv_heads: int, max_keys: int, num_sms: int = 132) -> int:
    """Splits of a decode's key range: enough programs to fill the SMs, each split >= MIN_SPLIT_KEYS.

    Depends on shapes and the static key bound only, so a captured CUDA graph stays valid.
    """
    want = triton.cdiv(PROGRAMS_PER_SM * num_sms, num_seqs * num_kv_heads)
    return max(1, min(want, triton.cdiv(max_keys, MIN_SPLIT_KEYS), MAX_SPLITS))


def paged_attention(
    q: Tensor,
    k_new: Tensor,
    v_new: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_table: Tensor,
    query_start: Tensor,
    context_lens: Tensor,
    sinks: Tensor,
    scale: float,
    window: int | None,
    ring_len: int | None,
    max_query_len: int,
    out: Tensor | None = None,
    max_context_hint: int | None = None,
) -> Tensor:
    """Causal attention of S sequences' new tokens over their cached context and themselves.

    q [T, Hq, D]; k_new, v_new [T, Hkv, D] (not yet in the cache); k_cache, v_cache
    [num_blocks, bs, Hkv, D]; block_table [>= S, W] int32 (a full layer's block table, or with
    `ring_len` a sliding layer's ring: position p at ring[(p // bs) % ring_len]); query_start
    [S + 1] int32; context_lens [S] int32 (cached positions = the first new token's position);
    sinks [Hq] float32. Returns out [T, Hq, D] (rows past query_start[S] are left untouched).

    A query at p sees keys (p - window, p]. Each program takes BLOCK_Q tokens x the G query heads
    of one KV head as the M rows of its dots: every K/V tile it loads serves G heads, so K/V are
    read once per KV head rather than once per query head, and M = 16 x 8 = 128 fills a Hopper
    warpgroup MMA; a decode has M = 8 heads padded to 16 (the smallest tl.dot). Key tiles outside
    the tile's window and past its causal limit are never loaded.

    Bytes moved, decode: per sequence Hkv x keys x D x 2 (K, V) x 2 B with keys = min(ctx + 1,
    window), plus q and out (2 x Hq x D x 2 B); split partials add Hq x splits x (D + 2) x 4 B x 2.
    Prefill: q, out and new K/V once, context K/V once per q tile of BLOCK_Q tokens (from L2).

    Decode (max_query_len == 1): grid (splits, S, Hkv), splits from `decode_splits` over
    max_context_hint (default: what the block table can address) and never from context_lens'
    values, so the launch replays in a CUDA graph; splits > 1 add a small reduce kernel.
    Prefill: grid (cdiv(max_query_len, BLOCK_Q), S, Hkv); tiles past a sequence's q_len exit.
    query_start holds absolute rows of q/out, so a mixed step runs as two launches over the same
    q/out with row slices, no rebasing: decodes (table[:n], query_start[:n + 1], context_lens[:n],
    max_query_len 1) on the split-K path, then chunks (table[n:], query_start[n:], ...).
    """
    t, hq, d = q.shape
    hkv = k_new.shape[1]
    nb, bs, hkv_c, d_c = k_cache.shape
    if hq % hkv or hkv != hkv_c or d != d_c or v_cache.shape != k_cache.shape:
        raise ValueError(
            f"shapes disagree: q {tuple(q.shape)}, k_new {tuple(k_new.shape)}, cache {tuple(k_cache.shape)}"
        )
    if d & (d - 1) or bs & (bs - 1):
        raise ValueError(f"head_dim {d} and block_size {bs} must be powers of two")
    if not q.dtype == k_new.dtype == v_new.dtype == k_cache.dtype == v_cache.dtype:
        raise ValueError("q, k_new, v_new and the caches must share one dtype")
    if (ring_len is not None) and window is None:
        raise ValueError("a ring table (ring_len) needs a window")
    if k_new.stride() != v_new.stride() or k_cache.stride() != v_cache.stride():
        raise ValueError("k and v tensors must have the same strides")
    if any(x.stride(-1) != 1 for x in (q, k_new, k_cache)) or block_table.stride(-1) != 1:
        raise ValueError("the last dim of q, k_new, the caches and the table must be contiguous")
    num_seqs = context_lens.shape[0]
    if query_start.shape[0] != num_seqs + 1:
        raise ValueError("query_start needs S + 1 entries")
    out = torch.empty_like(q) if out is None else out
    if t == 0 or num_seqs == 0 or max_query_len == 0:
        return out
    g = hq // hkv
    g_pad = triton.next_power_of_2(g)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    qk_scale = scale * LOG2E
    win = window or 0
    common = dict(
        G=g,
        G_PAD=g_pad,
        D=d,
        BS=bs,
        RING=ring_len is not None,
        WINDOWED=window is not None,
        PRECISION=precision,
        UPCAST=INTERPRETED,
    )
    if max_query_len == 1:
        block_n, warps, stages = DECODE_CFG
        block_q = max(1, 16 // g_pad)
        max_keys = max_context_hint or block_table.shape[1] * bs
        if window is not None:
            max_keys = min(max_keys, window)
        sms = _num_sms(q.device.index or 0) if q.is_cuda else 132
        splits = decode_splits(num_seqs, hkv, max_keys, sms)
    else:
        block_n, warps, stages = PREFILL_CFG
        block_q = max(1, PREFILL_ROWS // g_pad)
        splits = 1
    if splits > 1:
        pm = torch.empty(num_seqs, hq, splits, device=q.device, dtype=torch.float32)
        pl = torch.empty_like(pm)
        pacc = torch.empty(num_seqs, hq, splits, d, device=q.device, dtype=torch.float32)
    else:
        pm = pl = pacc = out  # unused
    grid = (triton.cdiv(max_query_len, block_q) * splits, num_seqs, hkv)
    _attn_kernel[grid](
        q,
        k_new,
        v_new,
        k_cache,
        v_cache,
        block_table,
        query_start,
        context_lens,
        sinks,
        out,
        pm,
        pl,
        pacc,
        qk_scale,
        win,
        ring_len or 1,
        splits,
        hq,
        q.stride(0),
        q.stride(1),
        k_new.stride(0),
        k_new.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_table.stride(0),
        out.stride(0),
        out.stride(1),
        BLOCK_Q=block_q,
        BLOCK_N=block_n,
        SPLIT=splits > 1,
        num_warps=warps,
        num_stages=stages,
        **common,
    )
    if splits > 1:
        _reduce_kernel[(num_seqs, hkv)](
            query_start,
            sinks,
            out,
            pm,
            pl,
            pacc,
            splits,
            hq,
            out.stride(0),
            out.stride(1),
            G=g,
            G_PAD=g_pad,
            NS_PAD=triton.next_power_of_2(splits),
            D=d,
            num_warps=2,
        )
    return out


def write_kv(k_new: Tensor, v_new: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    """Store token t's K/V [Hkv, D] at flat slot slot_mapping[t] (block * bs + offset) of the
    caches [num_blocks, bs, Hkv, D]; -1 skips the token, with no host sync. Moves
    4 x T x Hkv x D x itemsize bytes (read K, V; write K, V)."""
    t, hkv, d = k_new.shape
    bs = k_cache.shape[1]
    if slot_mapping.shape != (t,) or k_cache.shape[2:] != (hkv, d) or v_cache.shape != k_cache.shape:
        raise ValueError(
            f"shapes disagree: k_new {tuple(k_new.shape)}, cache "
            f"{tuple(k_cache.shape)}, slots {tuple(slot_mapping.shape)}"
        )
    if k_new.stride() != v_new.stride() or k_cache.stride() != v_cache.stride():
        raise ValueError("k and v tensors must have the same strides")
    if k_new.stride(-1) != 1 or k_cache.stride(-1) != 1 or d & (d - 1) or bs & (bs - 1):
        raise ValueError("contiguous last dims and power-of-two head_dim and block_size needed")
    if t == 0:
        return
    _write_kv_kernel[(t,)](
        k_new,
        v_new,
        k_cache,
        v_cache,
        slot_mapping,
        k_new.stride(0),
        k_new.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        HKV=hkv,
        H_PAD=triton.next_power_of_2(hkv),
        D=d,
        BS=bs,
        num_warps=1,
    )

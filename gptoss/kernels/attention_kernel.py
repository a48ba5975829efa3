"""The Triton side of paged attention with sinks (gptoss.kernels.attention launches it): a tile of
query rows against a range of keys (_tile, _phase) and the prefill/decode kernel; the reduce that
merges split-K partials with the sink is in attention_reduce."""

from __future__ import annotations

import triton
import triton.language as tl

from gptoss.kernels import pdl
from gptoss.kernels.attention_reduce import merge_splits


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
    lock_ptr,
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
    MERGE: tl.constexpr,
    NS_PAD: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    PDL: tl.constexpr,
):
    """Program (q tile x split, sequence, KV head): rows are BLOCK_Q tokens x G_PAD heads. MERGE
    (decode splits): the last split of a (sequence, KV head) to finish merges the partials itself."""
    pdl.wait_then_release(PDL)
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
        if MERGE:
            # A ticket per (sequence, KV head), as a split-K semaphore: the barrier orders every
            # thread's partial stores before the ticket, whose release (gpu scope) publishes them;
            # the program that draws the last ticket acquires them all, merges (reading past L1)
            # and zeroes the ticket for the next launch (launches in a stream never overlap).
            tl.debug_barrier()
            lock = lock_ptr + s_idx * tl.num_programs(2) + h
            if tl.atomic_add(lock, 1, sem="acq_rel", scope="gpu") == num_splits - 1:
                tl.store(lock, 0)
                merge_splits(
                    sink_ptr,
                    out_ptr,
                    pm_ptr,
                    pl_ptr,
                    pacc_ptr,
                    s_idx,
                    h,
                    q0,
                    num_splits,
                    hq,
                    stride_ot,
                    stride_oh,
                    G,
                    G_PAD,
                    NS_PAD,
                    D,
                    ".cg",
                )
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

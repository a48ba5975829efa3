"""The Triton side of paged attention with sinks (gptoss.kernels.attention launches it): the
prefill/decode kernel, a tile of query rows against its key range in two phases (cached context, then
this step's keys: attention_tile), and the end of a split (partials; with MERGE the last split merges
them, attention_reduce) or of the whole range (the sink, the output). With ROPE a decode ropes q and
the new key itself and writes the cache (attention_rope)."""

from __future__ import annotations

import triton
import triton.language as tl

from gptoss.kernels import pdl
from gptoss.kernels.attention_reduce import group_sinks, merge_splits
from gptoss.kernels.attention_rope import rope_rows, rope_table, store_kv
from gptoss.kernels.attention_tile import _dot, _kv, _phase, cache_offsets, softmax_step, tile_runs
from gptoss.kernels.l2_prefetch import prefetch_lines


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
    pos_ptr,
    cs_ptr,
    slot_ptr,
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
    ROPE: tl.constexpr,
    KV_FP8: tl.constexpr,
    PF_KEYS: tl.constexpr = 0,
    PRE_KV: tl.constexpr = False,
    LIVE: tl.constexpr = False,
    NEW_N: tl.constexpr = 0,
    HEADS_FIRST: tl.constexpr = False,
):
    """Program (q tile x split, sequence, KV head): rows are BLOCK_Q tokens x G_PAD heads. MERGE
    (decode splits): the last split of a (sequence, KV head) to finish merges the partials itself.
    ROPE (decode): q and this step's key arrive un-roped; they are roped at positions pos_ptr[t] with
    the cos_sin table at cs_ptr, and the program whose keys hold this step's key stores the roped key
    and v at slot_ptr[t] (attention_rope). PF_KEYS > 0 (decode, PDL): before the wait, the program
    prefetches into L2 the cached K and V rows of the first PF_KEYS keys of its range.
    PDL: what the host wrote before the step's first kernel (the step's metadata, the positions and
    their RoPE table rows, the new key's cache slot; with PF_KEYS the table and the cache below ctx)
    loads before the wait, so those round trips overlap the kernel ahead (the QKV GEMV, whose last
    wave leaves room); q and this step's k and v, which that kernel writes, load after it. PRE_KV
    (decode): the first BLOCK_N cached keys of the program's range and their values load there too,
    into registers, so after the wait that tile costs no round trip; the rest of the range runs as
    before, tile by tile in the same order (the same bits). LIVE (with MERGE): the splits past the
    last that holds keys of the sequence (live splits: n_live, from ctx) return before any load, the
    live ones take the tickets and the merge reads only their partials: at batch 1 under a 4096-key
    bound a full layer's 16 splits of 256 keys, of which a 640-key context fills 3 (the same bits:
    the partials of empty splits are neutral, m -inf, l 0, acc 0). NEW_N (decode: one new key a
    sequence; 0: BLOCK_N): the width of the new keys' tiles. At batch 1 the new key took a softmax
    step over a whole BLOCK_N-wide tile (256 keys) of one live row; 16 keys hold it. The same bits:
    the other columns' terms are exact zeros in either width. HEADS_FIRST (decode): the grid is (KV
    head, split, sequence) instead, so a sequence's KV heads launch side by side: they read the same
    cached token rows (a head's 128 bytes of each 1 KB row at 20b's shapes) at about the same time,
    where the default order launches every sequence's head 0 before any head 1. The same bits."""
    NEW_BN: tl.constexpr = NEW_N if NEW_N > 0 else BLOCK_N
    BM: tl.constexpr = BLOCK_Q * G_PAD
    if HEADS_FIRST:
        h, pid0, s_idx = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        n_heads, n_pid0 = tl.num_programs(0), tl.num_programs(1)
    else:
        pid0, s_idx, h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        n_heads, n_pid0 = tl.num_programs(2), tl.num_programs(0)
    # Latest q tiles (longest causal key ranges) start first.
    tile = n_pid0 // num_splits - 1 - pid0 // num_splits
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
    lo = 0
    if WINDOWED:
        lo = tl.maximum(q_first - window + 1, 0)  # keys below are outside every row's window
    hi = q_last + 1
    n_live = num_splits
    if SPLIT:
        chunk = ((hi - lo + num_splits - 1) // num_splits + BLOCK_N - 1) // BLOCK_N * BLOCK_N
        if LIVE:  # the splits that hold keys of this sequence; the later ones have nothing to merge
            n_live = (hi - lo + chunk - 1) // chunk
        lo = lo + split * chunk
        hi = tl.minimum(hi, lo + chunk)  # empty for late splits: neutral partials below
        if LIVE:
            if split >= n_live:
                return
    if ROPE:  # decode: q and the new key are roped at their positions' table rows
        cos_q, sin_q = rope_table(tl.load(pos_ptr + tok, mask=row_ok, other=0), cs_ptr, row_ok, D)
        # The new key (token row q0, position ctx) once, as the new keys' tile sees it: row 0 of a
        # [NEW_BN, D] tile, zeros after; the tile loop then loads nothing for it (a roped tile inside
        # the loop was pipelined: 148 registers and 35 KB shared against 96 and 19.5). Splits
        # partition the keys, so only the program holding it stores it, and no program of this
        # launch reads that slot (context keys come from the cache below ctx).
        nk = tl.arange(0, NEW_BN)
        new_ok = (nk == 0) & (tl.maximum(lo, ctx) < hi)
        nrow = (q0 + nk * 0).to(tl.int64)
        cos_k, sin_k = rope_table(tl.load(pos_ptr + nrow, mask=new_ok, other=0), cs_ptr, new_ok, D)
        nslot = tl.load(slot_ptr + nrow, mask=new_ok, other=-1).to(tl.int64)
    ctx_lo = lo  # where the context loop starts: past the preloaded tile with PRE_KV
    if PRE_KV:
        kp0 = lo + tl.arange(0, BLOCK_N)
        ok0 = kp0 < tl.minimum(hi, ctx)
        off0 = cache_offsets(
            table_ptr, s_idx, h, kp0, ok0, ring_len, stride_cb, stride_cs, stride_ch, stride_tb, BS, RING
        )
        k0 = tl.load(kc_ptr + off0[:, None] + d[None, :], mask=ok0[:, None], other=0.0)
        v0 = tl.load(vc_ptr + off0[:, None] + d[None, :], mask=ok0[:, None], other=0.0)
        ctx_lo = lo + BLOCK_N
    if PF_KEYS > 0:  # L2 line prefetches of the cached K and V rows of the range's first PF_KEYS keys
        kp_pf = lo + tl.arange(0, PF_KEYS)
        ok_pf = kp_pf < tl.minimum(hi, ctx)
        off_pf = cache_offsets(
            table_ptr, s_idx, h, kp_pf, ok_pf, ring_len, stride_cb, stride_cs, stride_ch, stride_tb, BS, RING
        )
        prefetch_lines(kc_ptr + off_pf, ok_pf)
        prefetch_lines(vc_ptr + off_pf, ok_pf)
    pdl.wait_then_release(PDL)
    if ROPE:  # decode: q arrives un-roped, and the new key is roped and cached in its phase below
        q = rope_rows(q_ptr, tok * stride_qt + head * stride_qh, cos_q, sin_q, row_ok, D)
    else:
        q = tl.load(
            q_ptr + tok[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
            mask=row_ok[:, None],
            other=0.0,
        )
    k_rope = None
    v_rope = None
    if ROPE:
        noff = nrow * stride_nt + h * stride_nh
        k_rope = rope_rows(kn_ptr, noff, cos_k, sin_k, new_ok, D)
        v_rope = tl.load(vn_ptr + noff[:, None] + d[None, :], mask=new_ok[:, None], other=0.0)
        store_kv(k_rope, v_rope, kc_ptr, vc_ptr, nslot, new_ok, h, stride_cb, stride_cs, stride_ch, BS, D)
    m = tl.full([BM], float("-inf"), tl.float32)
    l = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    if PRE_KV:  # the preloaded first tile, masked or not as _phase would run it (its tile 0)
        k0 = _kv(k0, q.dtype, True, KV_FP8)
        # _phase runs a tile every row sees whole (past the window's edge, below the causal limit)
        # unmasked, and the compiled masked step differs in its last bits: its tl.where keeps the
        # scale's multiply out of the FMA that the unmasked one folds it into (float32 outputs
        # differed on an H200 with the masked form always, v33). tile_runs of the range _phase
        # would have run from lo says which: tile 0 is unmasked when no lead tile precedes it and
        # the unmasked run holds it.
        _, n_lead0, n_mid0 = tile_runs(lo, tl.minimum(hi, ctx), q_first, q_last, window, BLOCK_N, WINDOWED)
        if (n_lead0 == 0) & (n_mid0 > 0):
            m, l, alpha, p = softmax_step(
                m, l, q, k0, qpos, kp0, ok0, window, qk_scale, False, WINDOWED, PRECISION, UPCAST
            )
        else:
            m, l, alpha, p = softmax_step(
                m, l, q, k0, qpos, kp0, ok0, window, qk_scale, True, WINDOWED, PRECISION, UPCAST
            )
        v0 = _kv(v0, q.dtype, True, KV_FP8)
        acc = acc * alpha[:, None] + _dot(p.to(v0.dtype), v0, PRECISION, UPCAST)
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
        ctx_lo,
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
        None,
        None,
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
        False,
        KV_FP8,
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
        k_rope,
        v_rope,
        stride_nt,
        stride_nh,
        stride_cb,
        stride_cs,
        stride_ch,
        stride_tb,
        D,
        BS,
        NEW_BN,
        False,
        RING,
        WINDOWED,
        PRECISION,
        UPCAST,
        ROPE,
        KV_FP8,
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
            lock = lock_ptr + s_idx * n_heads + h
            if tl.atomic_add(lock, 1, sem="acq_rel", scope="gpu") == n_live - 1:
                tl.store(lock, 0)
                merge_splits(
                    group_sinks(sink_ptr, h, G, G_PAD),
                    out_ptr,
                    pm_ptr,
                    pl_ptr,
                    pacc_ptr,
                    s_idx,
                    h,
                    q0,
                    num_splits,
                    n_live,
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

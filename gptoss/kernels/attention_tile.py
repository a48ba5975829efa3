"""Paged attention's key loop (gptoss.kernels.attention_kernel runs it): one online-softmax step over a
tile of keys (_tile, from the cache through the block table or ring, or from this step's new keys)
and a key range in tiles (_phase: masked tiles at the window's and the causal edges, unmasked ones
between)."""

from __future__ import annotations

import triton
import triton.language as tl

from gptoss.kernels.fp8 import as_stored


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    if UPCAST:
        r = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        r = tl.dot(a, b, input_precision=PRECISION)
    return r


@triton.jit
def _kv(x, dtype: tl.constexpr, FROM_CACHE: tl.constexpr, KV_FP8: tl.constexpr):
    """A K or V tile in q's dtype as attention sees it. KV_FP8 (an e4m3 cache): cached tiles widen
    exactly; this step's own keys and values (k_new, v_new) are rounded as the cache stores them.
    Not yet timed. sm_90a, compiled on CPU (decode, bf16, G 8, BLOCK_N 32, 2 warps, 3 stages): the
    key loop takes 518 instructions against 236 with a bf16 cache, 128 registers against 116, as
    the e4m3 tiles reach the MMA through byte loads from shared memory (LDS.U8); whether halving
    the bytes wins where decode attention is bandwidth-bound (large batches) is for the GPU."""
    if not KV_FP8:
        r = x
    elif FROM_CACHE:
        r = x.to(dtype)
    else:
        r = as_stored(x, True)
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
    k_rope,
    v_rope,
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
    ROPE: tl.constexpr,
    KV_FP8: tl.constexpr,
):
    """One online-softmax step over keys [ps + j*BLOCK_N, +BLOCK_N) (log2 domain, float32). ROPE (a
    decode's new key, not FROM_CACHE): the keys are k_rope, the kernel's roped tile of that one key,
    and the values v_rope, the tile the kernel loaded to cache (no second load of that row: it was
    a dependent L2 round trip after the first tile's softmax)."""
    kp = ps + j * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN] key positions
    d = tl.arange(0, D)
    kv_ok = kp < pe
    if FROM_CACHE:
        off = cache_offsets(
            table_ptr,
            s_idx,
            h,
            kp,
            kv_ok,
            ring_len,
            stride_cb,
            stride_cs,
            stride_ch,
            stride_tb,
            BS,
            RING,
            MASKED,
        )
        k_ptrs = kc_ptr + off[:, None] + d[None, :]
        v_ptrs = vc_ptr + off[:, None] + d[None, :]
    else:
        row = (q0 + kp - ctx).to(tl.int64)  # this step's token rows
        off = row * stride_nt + h * stride_nh
        k_ptrs = kn_ptr + off[:, None] + d[None, :]
        v_ptrs = vn_ptr + off[:, None] + d[None, :]
    if ROPE:  # this step's key, roped (and cached) once before the loops: k_rope's row 0, zeros after
        k = k_rope
    elif MASKED:
        k = _kv(tl.load(k_ptrs, mask=kv_ok[:, None], other=0.0), q.dtype, FROM_CACHE, KV_FP8)
    else:
        k = _kv(tl.load(k_ptrs), q.dtype, FROM_CACHE, KV_FP8)
    m_new, l, alpha, p = softmax_step(
        m, l, q, k, qpos, kp, kv_ok, window, qk_scale, MASKED, WINDOWED, PRECISION, UPCAST
    )
    if ROPE:
        v = v_rope
    elif MASKED:
        v = _kv(tl.load(v_ptrs, mask=kv_ok[:, None], other=0.0), q.dtype, FROM_CACHE, KV_FP8)
    else:
        v = _kv(tl.load(v_ptrs), q.dtype, FROM_CACHE, KV_FP8)
    acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, PRECISION, UPCAST)
    return acc, m_new, l


@triton.jit
def cache_offsets(
    table_ptr,
    s_idx,
    h,
    kp,
    ok,
    ring_len,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_tb,
    BS: tl.constexpr,
    RING: tl.constexpr,
    MASKED: tl.constexpr = True,
):
    """Element offsets [BN] int64 of KV head h's cached rows at key positions kp (where ok; MASKED
    loads the table under that mask), through the block table or, RING, the ring of a sliding layer."""
    if RING:
        slot = (kp // BS) % ring_len
    else:
        slot = kp // BS
    if MASKED:
        page = tl.load(table_ptr + s_idx * stride_tb + slot, mask=ok, other=0)
    else:
        page = tl.load(table_ptr + s_idx * stride_tb + slot)
    return page.to(tl.int64) * stride_cb + (kp % BS) * stride_cs + h * stride_ch


@triton.jit
def softmax_step(
    m,
    l,
    q,
    k,
    qpos,
    kp,
    kv_ok,
    window,
    qk_scale,
    MASKED: tl.constexpr,
    WINDOWED: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """The scores of q against a K tile (masked: keys past the range, the causal edge and, WINDOWED,
    the window) and the online softmax's update: (m_new, l_new, alpha, p); the caller adds p @ V."""
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
    return m_new, l * alpha + tl.sum(p, 1), alpha, p


@triton.jit
def tile_runs(ps, pe, q_first, q_last, window, BLOCK_N: tl.constexpr, WINDOWED: tl.constexpr):
    """Keys [ps, pe) in BLOCK_N tiles from ps, for query rows at [q_first, q_last]: (n_tot, n_lead,
    n_mid). Tiles [0, n_lead) reach below the window of the last row, tiles [n_lead, n_lead + n_mid)
    every row sees whole (_phase runs them unmasked), the rest reach past the causal limit of the
    first row or the range's end. One place for _phase and the decode preload, which runs its tile 0
    on its own and must pick the softmax step _phase would (the two steps differ in their last bits)."""
    span = tl.maximum(pe - ps, 0)
    n_tot = (span + BLOCK_N - 1) // BLOCK_N
    lo_all = ps  # first key every row of the tile sees (window edge)
    if WINDOWED:
        lo_all = tl.maximum(ps, q_last - window + 1)
    hi_all = tl.minimum(pe, q_first + 1)  # keys below it are causally visible to every row
    n_lead = tl.minimum(n_tot, (tl.maximum(lo_all - ps, 0) + BLOCK_N - 1) // BLOCK_N)
    n_mid = tl.maximum(tl.maximum(hi_all - ps, 0) // BLOCK_N - n_lead, 0)
    return n_tot, n_lead, n_mid


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
    k_rope,
    v_rope,
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
    ROPE: tl.constexpr,
    KV_FP8: tl.constexpr,
):
    """Keys [ps, pe) in tiles from ps: masked tiles at the window's lower edge, unmasked tiles
    every row sees whole, masked tiles at the causal edge and the range's end (tile_runs)."""
    n_tot, n_lead, n_mid = tile_runs(ps, pe, q_first, q_last, window, BLOCK_N, WINDOWED)
    if ROPE:  # decode's new keys, one a sequence: all through the masked loop, the only one that ropes
        n_lead = 0
        n_mid = 0
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
            BLOCK_N,
            FROM_CACHE,
            RING,
            WINDOWED,
            True,
            PRECISION,
            UPCAST,
            False,  # ROPE: these loops never run under it
            KV_FP8,
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
            BLOCK_N,
            FROM_CACHE,
            RING,
            WINDOWED,
            False,
            PRECISION,
            UPCAST,
            False,  # ROPE: these loops never run under it
            KV_FP8,
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
            BLOCK_N,
            FROM_CACHE,
            RING,
            WINDOWED,
            True,
            PRECISION,
            UPCAST,
            ROPE,
            KV_FP8,
        )
    return acc, m, l

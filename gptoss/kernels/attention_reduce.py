"""The split-K reduce of decode attention: partials + sink -> out, as its own kernel (gptoss.kernels.attention
launches it) or run by the last split program inside the attention kernel (merge_splits)."""

from __future__ import annotations

import triton
import triton.language as tl

from gptoss.kernels import pdl


@triton.jit
def group_sinks(sink_ptr, h, G: tl.constexpr, G_PAD: tl.constexpr):
    """KV head h's query heads' sinks [G_PAD] in log2 units (-inf past G). They never change: the
    reduce kernel loads them before its PDL wait."""
    g = tl.arange(0, G_PAD)
    return tl.load(sink_ptr + h * G + g, mask=g < G, other=float("-inf")) * 1.4426950408889634


@triton.jit
def _split_tile(pm_ptr, pacc_ptr, base, s0, n_live, ok, c, d, D: tl.constexpr, CACHE: tl.constexpr):
    """Splits s0 .. s0 + SC of the group's heads (those < n_live): m [G_PAD, SC], acc [G_PAD, SC, D]."""
    part = base[:, None] + s0 + c[None, :]  # [G_PAD, SC]
    cm = ok[:, None] & ((s0 + c)[None, :] < n_live)
    m_c = tl.load(pm_ptr + part, mask=cm, other=float("-inf"), cache_modifier=CACHE)
    a_c = tl.load(
        pacc_ptr + part[:, :, None] * D + d[None, None, :],
        mask=cm[:, :, None],
        other=0.0,
        cache_modifier=CACHE,
    )
    return m_c, a_c


@triton.jit
def merge_splits(
    sink,
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
    G: tl.constexpr,
    G_PAD: tl.constexpr,
    NS_PAD: tl.constexpr,
    D: tl.constexpr,
    CACHE: tl.constexpr,
):
    """Merge the split partials of KV head h's query heads (sequence s_idx, its token q0) with their
    sinks (group_sinks) into out. CACHE ".cg" reads them past L1: the attention kernel's last split
    merges partials other programs wrote during the same launch.

    The partials load SC splits at a time as one [G_PAD, SC, D] tile, so a merge of num_splits takes
    num_splits / SC dependent round trips to L2, not one a split: at batch 1 a full layer's decode
    runs 16 splits (decode_splits over a 4096-key bound) and a loop of one split a step waited 16
    times (sm_90a: LDG, then its use, each iteration). Each tile's products are summed over its
    splits (tl.sum), the tiles in order: a fixed order for a given split count.

    Only the first n_live splits are read (the attention kernel's live splits; the reduce kernel
    passes num_splits): the others hold neutral partials (m -inf, l 0, acc 0), or nothing where
    their programs returned at once, so leaving them out keeps the bits. The first tile loads with
    m and l, before the max they feed, so a merge of up to SC live splits is one round trip."""
    SC: tl.constexpr = NS_PAD if NS_PAD < 8 else 8
    g = tl.arange(0, G_PAD)
    ok = g < G
    head = h * G + g
    base = (s_idx * hq + head) * num_splits  # [G_PAD]
    sp = tl.arange(0, NS_PAD)
    pmask = ok[:, None] & (sp[None, :] < n_live)
    ms = tl.load(pm_ptr + base[:, None] + sp[None, :], mask=pmask, other=float("-inf"), cache_modifier=CACHE)
    ls = tl.load(pl_ptr + base[:, None] + sp[None, :], mask=pmask, other=0.0, cache_modifier=CACHE)
    d = tl.arange(0, D)
    c = tl.arange(0, SC)
    m_0, a_0 = _split_tile(pm_ptr, pacc_ptr, base, 0, n_live, ok, c, d, D, CACHE)
    m_f = tl.maximum(tl.max(ms, 1), sink)
    m_f = tl.where(m_f == float("-inf"), 0.0, m_f)
    den = tl.sum(ls * tl.exp2(ms - m_f[:, None]), 1) + tl.exp2(sink - m_f)
    acc = tl.zeros([G_PAD, D], tl.float32)
    acc += tl.sum(a_0 * tl.exp2(m_0 - m_f[:, None])[:, :, None], axis=1)
    for s0 in range(SC, n_live, SC):
        m_c, a_c = _split_tile(pm_ptr, pacc_ptr, base, s0, n_live, ok, c, d, D, CACHE)
        acc += tl.sum(a_c * tl.exp2(m_c - m_f[:, None])[:, :, None], axis=1)
    o = acc / tl.where(den == 0.0, 1.0, den)[:, None]
    tl.store(
        out_ptr + q0.to(tl.int64) * stride_ot + head[:, None] * stride_oh + d[None, :],
        o.to(out_ptr.dtype.element_ty),
        mask=ok[:, None],
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
    PDL: tl.constexpr,
):
    """Program (sequence, KV head): merges the split partials of the group's heads with the sink.
    The sinks and the query start (the host wrote it before the step) load before the PDL wait, the
    partials (the attention kernel's) after it."""
    s_idx = tl.program_id(0)
    h = tl.program_id(1)
    sink = group_sinks(sink_ptr, h, G, G_PAD)
    q0 = tl.load(qstart_ptr + s_idx)
    empty = tl.load(qstart_ptr + s_idx + 1) == q0
    pdl.wait_then_release(PDL)
    if empty:
        return
    merge_splits(
        sink,
        out_ptr,
        pm_ptr,
        pl_ptr,
        pacc_ptr,
        s_idx,
        h,
        q0,
        num_splits,
        num_splits,
        hq,
        stride_ot,
        stride_oh,
        G,
        G_PAD,
        NS_PAD,
        D,
        "",
    )

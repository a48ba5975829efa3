"""The split-K reduce of decode attention: partials + sink -> out, as its own kernel (gptoss.kernels.attention
launches it) or run by the last split program inside the attention kernel (merge_splits)."""

from __future__ import annotations

import triton
import triton.language as tl

from gptoss.kernels import pdl


@triton.jit
def merge_splits(
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
    G: tl.constexpr,
    G_PAD: tl.constexpr,
    NS_PAD: tl.constexpr,
    D: tl.constexpr,
    CACHE: tl.constexpr,
):
    """Merge the split partials of KV head h's query heads (sequence s_idx, its token q0) with the
    sink into out. CACHE ".cg" reads them past L1: the attention kernel's last split merges partials
    other programs wrote during the same launch."""
    g = tl.arange(0, G_PAD)
    ok = g < G
    head = h * G + g
    base = (s_idx * hq + head) * num_splits  # [G_PAD]
    sp = tl.arange(0, NS_PAD)
    pmask = ok[:, None] & (sp[None, :] < num_splits)
    ms = tl.load(pm_ptr + base[:, None] + sp[None, :], mask=pmask, other=float("-inf"), cache_modifier=CACHE)
    ls = tl.load(pl_ptr + base[:, None] + sp[None, :], mask=pmask, other=0.0, cache_modifier=CACHE)
    sink = tl.load(sink_ptr + head, mask=ok, other=float("-inf")) * 1.4426950408889634
    m_f = tl.maximum(tl.max(ms, 1), sink)
    m_f = tl.where(m_f == float("-inf"), 0.0, m_f)
    den = tl.sum(ls * tl.exp2(ms - m_f[:, None]), 1) + tl.exp2(sink - m_f)
    d = tl.arange(0, D)
    acc = tl.zeros([G_PAD, D], tl.float32)
    for i in range(0, num_splits):
        m_i = tl.load(pm_ptr + base + i, mask=ok, other=float("-inf"), cache_modifier=CACHE)
        a_i = tl.load(
            pacc_ptr + (base + i)[:, None] * D + d[None, :], mask=ok[:, None], other=0.0, cache_modifier=CACHE
        )
        acc += a_i * tl.exp2(m_i - m_f)[:, None]
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
    """Program (sequence, KV head): merges the split partials of the group's heads with the sink."""
    pdl.wait_then_release(PDL)
    s_idx = tl.program_id(0)
    h = tl.program_id(1)
    q0 = tl.load(qstart_ptr + s_idx)
    if tl.load(qstart_ptr + s_idx + 1) == q0:
        return
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
        "",
    )

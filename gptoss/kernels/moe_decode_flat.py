"""The decode MoE's persistent ("flat") GEMMs: the same work as moe_decode_kernels' expert-slot
kernels, spread evenly over a fixed grid of a few programs an SM.

Why. The slot kernels run one program per (column block, active expert), each streaming 6 K steps
of its expert's weights. At batch 1 (20b) that is 720 gate_up programs for 528 resident slots, 1.36
waves, and each program pays its pipeline's fill (the first loads' latency) for 6 steps of work: the
decode MoE streams at ~1.7-1.8 TB/s of the ~3 TB/s a copy reaches (bench/results v14, v15). Here the
items (active expert s, column block) are numbered expert-major and program p takes the contiguous
range [p * items / G, (p + 1) * items / G): every program gets the same number of items to within
one, whatever the routing, and runs them as ONE loop over (column block, K step), so its weight
loads stay pipelined across column blocks; the SwiGLU (or bias) epilogue runs when a block's last
K step is in. A range crosses an expert boundary at most a few times (items per program << blocks
an expert); the loop restarts there. G depends on the shapes only (CUDA graphs).

The arguments are the slot kernels', so moe_decode launches either with the same call. Each item's
sums are the slot kernels' (same K steps, same dots): the two give equal bits. N % BN == 0 (the
launcher falls back to the slot kernels otherwise).
"""

from __future__ import annotations

import triton
import triton.language as tl

from gptoss.kernels import pdl
from gptoss.kernels.moe_common import _lora_expand, _slot_expert
from gptoss.kernels.moe_decode_kernels import _x_tile_ok
from gptoss.kernels.moe_routing import expert_counts, slot_rows
from gptoss.kernels.moe_v2_step import _v2_pair_step, _v2_ptrs, _v2_step


@triton.jit
def _item_range(cnt, NB: tl.constexpr):
    """This program's items [start, end) of the n_active * NB (active experts x column blocks)."""
    pid, g = tl.program_id(0), tl.num_programs(0)
    total = tl.sum((cnt > 0).to(tl.int32), 0) * NB
    return (pid * total) // g, ((pid + 1) * total) // g


@triton.jit
def _expert_span(cnt, ex, s, start, end, NB: tl.constexpr):
    """The s-th active expert (id, rows, where its packed rows start, as _slot_expert) and the column
    blocks [lo, hi) of it that are among this program's items."""
    e, n_rows, packed = _slot_expert(cnt, ex, s)
    return e.to(tl.int64), n_rows, packed, tl.maximum(start - s * NB, 0), tl.minimum(end - s * NB, NB)


@triton.jit(do_not_specialize=["T"])
def _gate_up_flat_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    b_ptr,
    act_ptr,
    counts_ptr,
    rows_ptr,
    logits_ptr,
    ids_ptr,
    wts_ptr,
    lb_ptr,
    ls_ptr,
    stride_lbe,
    stride_lbp,
    T,
    stride_l,
    stride_x,
    stride_we,
    stride_wp,
    stride_wn,
    stride_se,
    stride_sp,
    stride_sn,
    alpha,
    limit,
    N: tl.constexpr,
    K: tl.constexpr,
    TOP_K: tl.constexpr,
    E: tl.constexpr,
    BE: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    SPLIT: tl.constexpr,
    PREC: tl.constexpr,
    ASM: tl.constexpr,
    ROUTE: tl.constexpr,
    KP: tl.constexpr,
    BT: tl.constexpr,
    LORA: tl.constexpr,
    LW: tl.constexpr,
    PDL: tl.constexpr,
):
    """_gate_up_dec_kernel's act (expert-packed rows), over this program's items."""
    pdl.wait_then_release(PDL)
    ex = tl.arange(0, BE)
    flat, a, pos, cnt = expert_counts(
        logits_ptr,
        T,
        stride_l,
        tl.program_id(0) == 0,
        ids_ptr,
        wts_ptr,
        counts_ptr,
        rows_ptr,
        E,
        TOP_K,
        KP,
        BE,
        BT,
        ROUTE,
    )
    NB: tl.constexpr = N // BN
    KSTEPS: tl.constexpr = (K + BK - 1) // BK
    EVEN_K: tl.constexpr = K % BK == 0
    start, end = _item_range(cnt, NB)
    for s in range(start // NB, (end + NB - 1) // NB):
        e64, n_rows, packed, lo, hi = _expert_span(cnt, ex, s, start, end, NB)
        for m0 in range(0, n_rows, BM):
            slot = m0 + tl.arange(0, BM)
            valid = slot < n_rows
            rows = slot_rows(flat, a, pos, rows_ptr, e64, slot, valid, T, ROUTE)
            w_g, s_g, x_t, kw, kx = _v2_ptrs(
                w_ptr + e64 * stride_we + lo * BN * stride_wn,
                s_ptr + e64 * stride_se + lo * BN * stride_sn,
                x_ptr,
                tl.arange(0, BN),
                (rows // TOP_K).to(tl.int64) * stride_x,
                stride_wn,
                stride_sn,
                BM,
                BN,
                BK,
                SPLIT,
                False,
            )
            if SPLIT == 1:
                acc_g = tl.zeros([BN, BM], tl.float32)
            else:
                acc_g = tl.zeros([SPLIT, BN, BM], tl.float32)
            acc_u = tl.zeros_like(acc_g)
            for i in range(0, (hi - lo) * KSTEPS):
                j = i // KSTEPS
                k0 = (i - j * KSTEPS) * BK
                wj = w_g + j * (BN * stride_wn)
                sj = s_g + j * (BN * stride_sn)
                xt = tl.load(x_t + k0, mask=_x_tile_ok(valid, kx, k0, K, SPLIT), other=0.0)
                acc_g, acc_u = _v2_pair_step(
                    acc_g,
                    acc_u,
                    xt,
                    wj,
                    sj,
                    stride_wp,
                    stride_sp,
                    kw,
                    k0,
                    K,
                    BN,
                    BK,
                    SPLIT,
                    EVEN_K,
                    PREC,
                    ASM,
                    False,
                )
                if k0 == (KSTEPS - 1) * BK:  # the block's sums are in: its SwiGLU and store
                    n = (lo + j) * BN + tl.arange(0, BN)
                    if SPLIT > 1:
                        g = tl.sum(acc_g, 0)
                        u = tl.sum(acc_u, 0)
                    else:
                        g = acc_g
                        u = acc_u
                    if LORA:
                        lb = lb_ptr + e64 * stride_lbe
                        g = _lora_expand(g, lb, ls_ptr, rows, valid, n, LW, PREC)
                        u = _lora_expand(u, lb + stride_lbp, ls_ptr, rows, valid, n, LW, PREC)
                    gate = tl.minimum(g + tl.load(b_ptr + e64 * 2 * N + n)[:, None], limit)
                    up = tl.minimum(
                        tl.maximum(u + tl.load(b_ptr + e64 * 2 * N + N + n)[:, None], -limit), limit
                    )
                    act = (up + 1.0) * (gate * tl.sigmoid(alpha * gate))
                    tl.store(
                        act_ptr + (packed + slot).to(tl.int64)[None, :] * N + n[:, None],
                        act.to(act_ptr.dtype.element_ty),
                        mask=valid[None, :],
                    )
                    acc_g = tl.zeros_like(acc_g)
                    acc_u = tl.zeros_like(acc_u)


@triton.jit(do_not_specialize=["T"])
def _down_flat_kernel(
    a_ptr,
    w_ptr,
    s_ptr,
    b_ptr,
    y_ptr,
    counts_ptr,
    rows_ptr,
    lb_ptr,
    ls_ptr,
    stride_lbe,
    T,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    N: tl.constexpr,
    K: tl.constexpr,
    E: tl.constexpr,
    BE: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    SPLIT: tl.constexpr,
    PREC: tl.constexpr,
    ASM: tl.constexpr,
    LORA: tl.constexpr,
    LW: tl.constexpr,
    PDL: tl.constexpr,
):
    """_down_dec_kernel's y rows (by assignment), over this program's items."""
    pdl.wait_then_release(PDL)
    ex = tl.arange(0, BE)
    cnt = tl.load(counts_ptr + ex, mask=ex < E, other=0)
    NB: tl.constexpr = N // BN
    KSTEPS: tl.constexpr = (K + BK - 1) // BK
    EVEN_K: tl.constexpr = K % BK == 0
    start, end = _item_range(cnt, NB)
    for s in range(start // NB, (end + NB - 1) // NB):
        e64, n_rows, packed, lo, hi = _expert_span(cnt, ex, s, start, end, NB)
        for m0 in range(0, n_rows, BM):
            slot = m0 + tl.arange(0, BM)
            valid = slot < n_rows
            rows = tl.load(rows_ptr + e64 * T + slot, mask=valid, other=0)
            w_t, s_t, a_t, kw, kx = _v2_ptrs(
                w_ptr + e64 * stride_we + lo * BN * stride_wn,
                s_ptr + e64 * stride_se + lo * BN * stride_sn,
                a_ptr,
                tl.arange(0, BN),
                (packed + slot).to(tl.int64) * K,
                stride_wn,
                stride_sn,
                BM,
                BN,
                BK,
                SPLIT,
                False,
            )
            if SPLIT == 1:
                acc = tl.zeros([BN, BM], tl.float32)
            else:
                acc = tl.zeros([SPLIT, BN, BM], tl.float32)
            for i in range(0, (hi - lo) * KSTEPS):
                j = i // KSTEPS
                k0 = (i - j * KSTEPS) * BK
                at = tl.load(a_t + k0, mask=_x_tile_ok(valid, kx, k0, K, SPLIT), other=0.0)
                acc = _v2_step(
                    acc,
                    at,
                    w_t + j * (BN * stride_wn),
                    s_t + j * (BN * stride_sn),
                    kw,
                    k0,
                    K,
                    BN,
                    BK,
                    SPLIT,
                    EVEN_K,
                    PREC,
                    ASM,
                    False,
                )
                if k0 == (KSTEPS - 1) * BK:
                    n = (lo + j) * BN + tl.arange(0, BN)
                    if SPLIT > 1:
                        y = tl.sum(acc, 0)
                    else:
                        y = acc
                    if LORA:
                        y = _lora_expand(y, lb_ptr + e64 * stride_lbe, ls_ptr, rows, valid, n, LW, PREC)
                    tl.store(
                        y_ptr + rows.to(tl.int64)[None, :] * N + n[:, None],
                        (y + tl.load(b_ptr + e64 * N + n)[:, None]).to(y_ptr.dtype.element_ty),
                        mask=valid[None, :],
                    )
                    acc = tl.zeros_like(acc)


def programs(items: int, sms: int, per_sm: int) -> int:
    """The flat grid: per_sm programs an SM, never more than there are items."""
    return max(1, min(items, sms * per_sm))

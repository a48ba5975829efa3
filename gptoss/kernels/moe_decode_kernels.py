"""The decode MoE's Triton kernels (moe_decode launches them): the expert-slot gate_up GEMM (with the
clamped SwiGLU, and optionally the routing of the logits in registers) and the down GEMM, both on the
bits layout's K step (moe_v2_step). A variant that loaded two K steps' words straight into registers
instead of cp.async stages was 28-38 % slower on the H100 (bench/results v18) and is gone."""

from __future__ import annotations

import triton
import triton.language as tl

from gptoss.kernels import pdl
from gptoss.kernels.moe_common import _lora_expand, _slot_expert
from gptoss.kernels.moe_routing import expert_counts, slot_rows
from gptoss.kernels.moe_v2_step import _v2_pair_step, _v2_ptrs, _v2_step


@triton.jit
def _x_tile_ok(valid, kx, k0, K: tl.constexpr, SPLIT: tl.constexpr):
    if SPLIT == 1:
        return valid[None, :] & ((k0 + kx) < K)
    else:
        return valid[None, None, :] & ((k0 + kx) < K)


@triton.jit(do_not_specialize=["T"])
def _gate_up_dec_kernel(
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
    PROBE: tl.constexpr = 0,
):
    """Program (column block, slot): act[rows of the slot's expert, block] = swiglu(x @ W13^T + b13).
    ROUTE: every program routes the [T, E] logits in registers (moe_routing._topk, _group: the
    routing kernel's decisions) instead of loading counts and rows; program (0, 0) stores them.
    LORA: + B13_e @ s^T before the SwiGLU, s the rows' shrunk x (moe_lora.shrink, by assignment)."""
    pdl.wait_then_release(PDL)
    pid_n, s = tl.program_id(0), tl.program_id(1)
    first = (pid_n == 0) & (s == 0)
    flat, a, pos, cnt = expert_counts(
        logits_ptr, T, stride_l, first, ids_ptr, wts_ptr, counts_ptr, rows_ptr, E, TOP_K, KP, BE, BT, ROUTE
    )
    e, n_rows, packed = _slot_expert(cnt, tl.arange(0, BE), s)
    if n_rows == 0:  # past the active experts
        return
    EVEN_K: tl.constexpr = K % BK == 0
    n = pid_n * BN + tl.arange(0, BN)
    n_ld = n % N  # past-the-end columns reload valid rows; never stored
    e64 = e.to(tl.int64)
    b_g = tl.load(b_ptr + e64 * 2 * N + n_ld)[:, None]  # [BN, 1]
    b_u = tl.load(b_ptr + e64 * 2 * N + N + n_ld)[:, None]
    for m0 in range(0, n_rows, BM):
        slot = m0 + tl.arange(0, BM)
        valid = slot < n_rows
        rows = slot_rows(flat, a, pos, rows_ptr, e, slot, valid, T, ROUTE)  # [BM] assignments t*k + j
        w_g, s_g, x_t, kw, kx = _v2_ptrs(
            w_ptr + e64 * stride_we,
            s_ptr + e64 * stride_se,
            x_ptr,
            n_ld,
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
        for k0 in range(0, K, BK):
            xt = tl.load(x_t + k0, mask=_x_tile_ok(valid, kx, k0, K, SPLIT), other=0.0)
            acc_g, acc_u = _v2_pair_step(
                acc_g,
                acc_u,
                xt,
                w_g,
                s_g,
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
                PROBE,
            )
        if SPLIT > 1:
            acc_g = tl.sum(acc_g, 0)
            acc_u = tl.sum(acc_u, 0)
        if LORA:
            lb = lb_ptr + e64 * stride_lbe
            acc_g = _lora_expand(acc_g, lb, ls_ptr, rows, valid, n_ld, LW, PREC)
            acc_u = _lora_expand(acc_u, lb + stride_lbp, ls_ptr, rows, valid, n_ld, LW, PREC)
        gate = tl.minimum(acc_g + b_g, limit)  # [BN, BM]
        up = tl.minimum(tl.maximum(acc_u + b_u, -limit), limit)
        act = (up + 1.0) * (gate * tl.sigmoid(alpha * gate))
        tl.store(
            act_ptr + (packed + slot).to(tl.int64)[None, :] * N + n[:, None],  # expert-packed rows
            act.to(act_ptr.dtype.element_ty),
            mask=(n < N)[:, None] & valid[None, :],
        )


@triton.jit(do_not_specialize=["T"])
def _down_dec_kernel(
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
    PROBE: tl.constexpr = 0,
):
    """Program (column block, slot): y[rows of the slot's expert, block] = act @ W2_e^T + b2_e
    (LORA: + B2_e @ s^T, s the rows' shrunk act by assignment)."""
    pdl.wait_then_release(PDL)
    pid_n, s = tl.program_id(0), tl.program_id(1)
    ex = tl.arange(0, BE)
    e, n_rows, packed = _slot_expert(tl.load(counts_ptr + ex, mask=ex < E, other=0), ex, s)
    if n_rows == 0:  # past the active experts
        return
    EVEN_K: tl.constexpr = K % BK == 0
    n = pid_n * BN + tl.arange(0, BN)
    n_ld = n % N
    e64 = e.to(tl.int64)
    bias = tl.load(b_ptr + e64 * N + n_ld)[:, None]  # [BN, 1]
    for m0 in range(0, n_rows, BM):
        slot = m0 + tl.arange(0, BM)
        valid = slot < n_rows
        rows = tl.load(rows_ptr + e * T + slot, mask=valid, other=0)  # [BM] assignments t*k + j
        w_t, s_t, a_t, kw, kx = _v2_ptrs(
            w_ptr + e64 * stride_we,
            s_ptr + e64 * stride_se,
            a_ptr,
            n_ld,
            (packed + slot).to(tl.int64) * K,  # expert-packed act rows
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
        for k0 in range(0, K, BK):
            at = tl.load(a_t + k0, mask=_x_tile_ok(valid, kx, k0, K, SPLIT), other=0.0)
            acc = _v2_step(acc, at, w_t, s_t, kw, k0, K, BN, BK, SPLIT, EVEN_K, PREC, ASM, False, PROBE)
        if SPLIT > 1:
            acc = tl.sum(acc, 0)
        if LORA:
            acc = _lora_expand(acc, lb_ptr + e64 * stride_lbe, ls_ptr, rows, valid, n_ld, LW, PREC)
        tl.store(
            y_ptr + rows.to(tl.int64)[None, :] * N + n[:, None],
            (acc + bias).to(y_ptr.dtype.element_ty),  # [BN, BM]
            mask=(n < N)[:, None] & valid[None, :],
        )

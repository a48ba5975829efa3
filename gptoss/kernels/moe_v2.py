"""The v2 MoE GEMMs (the default): weights in the bits layout (gptoss.kernels.moe_layout), a rotate
and a mask per bf16x2 register, split-K warps at decode and xa tiles in between; see
gptoss.kernels.moe for the whole forward."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from gptoss.kernels import moe_common as common
from gptoss.kernels.moe_common import _expert_tile, _lora_args, _lora_expand, _precision
from gptoss.kernels.moe_layout import MoEWeights
from gptoss.kernels.moe_routing import Routing
from gptoss.kernels.moe_tiles import Tiles, _grid
from gptoss.kernels.moe_v2_step import _v2_pair_step, _v2_ptrs, _v2_step


@triton.jit(do_not_specialize=["T"])  # T changes every step: no recompiles on its value
def _gate_up_v2_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    b_ptr,
    act_ptr,
    counts_ptr,
    rows_ptr,
    lb_ptr,
    ls_ptr,
    stride_lbe,
    stride_lbp,
    T,
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
    XA: tl.constexpr,
    LORA: tl.constexpr,
    LW: tl.constexpr,
):
    """_gate_up_kernel on v2 weights (scale strides in int32 words): act = swiglu(x @ W13^T + b13)."""
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    e, rows, valid, n_tiles = _expert_tile(counts_ptr, rows_ptr, T, pid_m, E, BE, BM)
    if pid_m >= n_tiles:
        return
    EVEN_K: tl.constexpr = K % BK == 0
    n = pid_n * BN + tl.arange(0, BN)  # [BN] act columns = weight-row pairs
    n_ld = n % N  # past-the-end columns reload valid rows; never stored
    e64 = e.to(tl.int64)
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
        XA,
    )
    if XA:
        acc_g = tl.zeros([BM, BN], tl.float32)
        x_ok = valid[:, None]
    elif SPLIT == 1:
        acc_g = tl.zeros([BN, BM], tl.float32)
        x_ok = valid[None, :]  # rows past the tile's assignments: not read (zeros)
    else:
        acc_g = tl.zeros([SPLIT, BN, BM], tl.float32)
        x_ok = valid[None, None, :]
    acc_u = tl.zeros_like(acc_g)
    for k0 in range(0, K, BK):
        xt = tl.load(x_t + k0, mask=x_ok & ((k0 + kx) < K), other=0.0)
        acc_g, acc_u = _v2_pair_step(
            acc_g, acc_u, xt, w_g, s_g, stride_wp, stride_sp, kw, k0, K, BN, BK, SPLIT, EVEN_K, PREC, ASM, XA
        )
    if SPLIT > 1:  # the warps' K slices: one reduction through shared memory
        acc_g = tl.sum(acc_g, 0)
        acc_u = tl.sum(acc_u, 0)
    if XA:  # the epilogue below works on [BN, BM]
        acc_g = tl.trans(acc_g)
        acc_u = tl.trans(acc_u)
    if LORA:  # + B_e @ s^T: the LoRA expand of the rows' shrunk x (gptoss.kernels.moe_lora)
        acc_g = _lora_expand(acc_g, lb_ptr + e64 * stride_lbe, ls_ptr, rows, valid, n_ld, LW, PREC)
        acc_u = _lora_expand(
            acc_u, lb_ptr + e64 * stride_lbe + stride_lbp, ls_ptr, rows, valid, n_ld, LW, PREC
        )
    gate = acc_g + tl.load(b_ptr + e64 * 2 * N + n_ld)[:, None]  # [BN, BM]
    up = acc_u + tl.load(b_ptr + e64 * 2 * N + N + n_ld)[:, None]
    gate = tl.minimum(gate, limit)
    up = tl.minimum(tl.maximum(up, -limit), limit)
    act = (up + 1.0) * (gate * tl.sigmoid(alpha * gate))
    tl.store(
        act_ptr + rows.to(tl.int64)[None, :] * N + n[:, None],
        act.to(act_ptr.dtype.element_ty),
        mask=(n < N)[:, None] & valid[None, :],
    )


@triton.jit(do_not_specialize=["T"])  # T changes every step: no recompiles on its value
def _down_v2_kernel(
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
    XA: tl.constexpr,
    LORA: tl.constexpr,
    LW: tl.constexpr,
):
    """_down_kernel on v2 weights: y = act @ W2^T + b2."""
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    e, rows, valid, n_tiles = _expert_tile(counts_ptr, rows_ptr, T, pid_m, E, BE, BM)
    if pid_m >= n_tiles:
        return
    EVEN_K: tl.constexpr = K % BK == 0
    n = pid_n * BN + tl.arange(0, BN)
    n_ld = n % N
    e64 = e.to(tl.int64)
    w_t, s_t, a_t, kw, kx = _v2_ptrs(
        w_ptr + e64 * stride_we,
        s_ptr + e64 * stride_se,
        a_ptr,
        n_ld,
        rows.to(tl.int64) * K,
        stride_wn,
        stride_sn,
        BM,
        BN,
        BK,
        SPLIT,
        XA,
    )
    if XA:
        acc = tl.zeros([BM, BN], tl.float32)
        a_ok = valid[:, None]
    elif SPLIT == 1:
        acc = tl.zeros([BN, BM], tl.float32)
        a_ok = valid[None, :]
    else:
        acc = tl.zeros([SPLIT, BN, BM], tl.float32)
        a_ok = valid[None, None, :]
    for k0 in range(0, K, BK):
        at = tl.load(a_t + k0, mask=a_ok & ((k0 + kx) < K), other=0.0)
        acc = _v2_step(acc, at, w_t, s_t, kw, k0, K, BN, BK, SPLIT, EVEN_K, PREC, ASM, XA)
    if SPLIT > 1:
        acc = tl.sum(acc, 0)
    if XA:
        acc = tl.trans(acc)
    if LORA:
        acc = _lora_expand(acc, lb_ptr + e64 * stride_lbe, ls_ptr, rows, valid, n_ld, LW, PREC)
    y = acc + tl.load(b_ptr + e64 * N + n_ld)[:, None]
    tl.store(
        y_ptr + rows.to(tl.int64)[None, :] * N + n[:, None],
        y.to(y_ptr.dtype.element_ty),
        mask=(n < N)[:, None] & valid[None, :],
    )


def gate_up_v2(
    x: Tensor,
    r: Routing,
    w: MoEWeights,
    alpha: float,
    limit: float,
    tiles: Tiles,
    lora: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """gate_up on v2 weights (layout "bits")."""
    (t, h), k = x.shape, r.ids.shape[1]
    e, _, i = w.shape
    act = common._empty((t * k, i), x.dtype, x.device)
    s13 = w.s13.view(torch.int32)  # scales read as 4-byte words
    w13 = w.w13
    largs, lkw = _lora_args(lora, x, planes=True)
    _gate_up_v2_kernel[_grid(t, k, e, i, tiles)](
        x,
        w13,
        s13,
        w.b13,
        act,
        r.counts,
        r.rows,
        *largs,
        t,
        x.stride(0),
        *w13.stride()[:3],
        *s13.stride()[:3],
        alpha,
        limit,
        N=i,
        K=h,
        TOP_K=k,
        E=e,
        BE=triton.next_power_of_2(e),
        BM=tiles.bm,
        BN=tiles.bn,
        BK=tiles.bk,
        SPLIT=tiles.split,
        PREC=_precision(x),
        ASM=common._use_asm(x),
        XA=tiles.xa,
        **lkw,
        num_warps=tiles.warps,
        num_stages=tiles.stages,
    )
    return act


def down_v2(
    act: Tensor, r: Routing, w: MoEWeights, tiles: Tiles, lora: tuple[Tensor, Tensor] | None = None
) -> Tensor:
    """down on v2 weights (layout "bits")."""
    a, i = act.shape
    e, h, _ = w.shape
    t = r.ids.shape[0]
    y = common._empty((a, h), act.dtype, act.device)
    w2, s2 = w.w2, w.s2.view(torch.int32)
    largs, lkw = _lora_args(lora, act, planes=False)
    _down_v2_kernel[_grid(t, r.ids.shape[1], e, h, tiles)](
        act,
        w2,
        s2,
        w.b2,
        y,
        r.counts,
        r.rows,
        *largs,
        t,
        *w2.stride()[:2],
        *s2.stride()[:2],
        N=h,
        K=i,
        E=e,
        BE=triton.next_power_of_2(e),
        BM=tiles.bm,
        BN=tiles.bn,
        BK=tiles.bk,
        SPLIT=tiles.split,
        PREC=_precision(act),
        ASM=common._use_asm(act),
        XA=tiles.xa,
        **lkw,
        num_warps=tiles.warps,
        num_stages=tiles.stages,
    )
    return y

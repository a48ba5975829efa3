"""The v3 MoE GEMMs for large batches: tl.dot_scaled with the MXFP4 weights as its e2m1 operand
(Triton lowers the upcast for the MMA), weights in the "v3" layout; see gptoss.kernels.moe."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from gptoss.kernels import moe_common as common
from gptoss.kernels.moe_common import _expert_tile, _lora_args, _lora_expand
from gptoss.kernels.moe_layout import MoEWeights
from gptoss.kernels.moe_routing import Routing
from gptoss.kernels.moe_tiles import Tiles, _grid
from gptoss.kernels.moe_v1 import _dequant

_FORMATS = {torch.bfloat16: "bf16", torch.float16: "fp16"}  # dot_scaled's names for the x operand


@triton.jit
def _v3_step(
    acc,
    x,
    w_ptrs,
    s_ptrs,
    g,
    k0,
    K: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    EVEN_K: tl.constexpr,
    X_FMT: tl.constexpr,
    SCALED: tl.constexpr,
):
    """acc [BN, BM] += W[:, k0:k0+BK] [BN, BK] @ x [BK, BM]; w_ptrs [BN, BK/2] packed bytes (low
    nibble first), s_ptrs [BN, BK/32] e8m0. SCALED: tl.dot_scaled (CUDA); else the interpreter's
    stand-in, the same bytes dequantized by v1's portable path and a plain tl.dot."""
    if EVEN_K:
        w = tl.load(w_ptrs + k0 // 2)
        s = tl.load(s_ptrs + k0 // 32)
    else:  # K tail: zero bytes decode to zeros (scale pads are zeros too, never NaN's 0xFF)
        g_ok = (k0 // 32 + g) < K // 32  # [BK/32]
        kw = tl.arange(0, BK // 2)
        w = tl.load(w_ptrs + k0 // 2, mask=((k0 + 2 * kw) < K)[None, :], other=0)
        s = tl.load(s_ptrs + k0 // 32, mask=g_ok[None, :], other=0)
    if SCALED:
        out = tl.dot_scaled(w, s, "e2m1", x, None, X_FMT, acc=acc, fast_math=True)
    else:
        wd = _dequant(tl.reshape(w, (BN, BK // 32, 16)), s, BN, BK, x.dtype, False)
        out = tl.dot(wd, x, acc)
    return out


@triton.jit(do_not_specialize=["T"])  # T changes every step: no recompiles on its value
def _gate_up_v3_kernel(
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
    X_FMT: tl.constexpr,
    SCALED: tl.constexpr,
    LORA: tl.constexpr,
    LW: tl.constexpr,
):
    """act[a, n] = swiglu(x[a // k] @ W13_e^T + b13_e) for the rows a of tile pid_m; N = I, K = H."""
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    e, rows, valid, n_tiles = _expert_tile(counts_ptr, rows_ptr, T, pid_m, E, BE, BM)
    if pid_m >= n_tiles:
        return
    EVEN_K: tl.constexpr = K % BK == 0
    n = pid_n * BN + tl.arange(0, BN)  # [BN] act columns = weight-row pairs
    n_ld = n % N  # past-the-end columns reload valid rows; never stored
    g, kk = tl.arange(0, BK // 32), tl.arange(0, BK)
    e64 = e.to(tl.int64)
    w_g = w_ptr + e64 * stride_we + n_ld[:, None] * stride_wn + tl.arange(0, BK // 2)[None, :]  # [BN, BK/2]
    s_g = s_ptr + e64 * stride_se + n_ld[:, None] * stride_sn + g[None, :]  # [BN, BK/32]
    x_t = x_ptr + (rows // TOP_K).to(tl.int64)[None, :] * stride_x + kk[:, None]  # [BK, BM]
    acc_g = tl.zeros([BN, BM], tl.float32)
    acc_u = tl.zeros([BN, BM], tl.float32)
    for k0 in range(0, K, BK):
        xt = tl.load(x_t + k0, mask=valid[None, :] & ((k0 + kk) < K)[:, None], other=0.0)
        acc_g = _v3_step(acc_g, xt, w_g, s_g, g, k0, K, BN, BK, EVEN_K, X_FMT, SCALED)
        acc_u = _v3_step(acc_u, xt, w_g + stride_wp, s_g + stride_sp, g, k0, K, BN, BK, EVEN_K, X_FMT, SCALED)
    if LORA:  # + B_e @ s^T: the LoRA expand of the rows' shrunk x (gptoss.kernels.moe_lora)
        acc_g = _lora_expand(acc_g, lb_ptr + e64 * stride_lbe, ls_ptr, rows, valid, n_ld, LW, "tf32")
        acc_u = _lora_expand(acc_u, lb_ptr + e64 * stride_lbe + stride_lbp, ls_ptr, rows, valid, n_ld, LW, "tf32")
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
def _down_v3_kernel(
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
    X_FMT: tl.constexpr,
    SCALED: tl.constexpr,
    LORA: tl.constexpr,
    LW: tl.constexpr,
):
    """y[a, n] = act[a] @ W2_e^T + b2_e for the rows a of tile pid_m; N = H, K = I."""
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    e, rows, valid, n_tiles = _expert_tile(counts_ptr, rows_ptr, T, pid_m, E, BE, BM)
    if pid_m >= n_tiles:
        return
    EVEN_K: tl.constexpr = K % BK == 0
    n = pid_n * BN + tl.arange(0, BN)
    n_ld = n % N
    g, kk = tl.arange(0, BK // 32), tl.arange(0, BK)
    e64 = e.to(tl.int64)
    w_t = w_ptr + e64 * stride_we + n_ld[:, None] * stride_wn + tl.arange(0, BK // 2)[None, :]  # [BN, BK/2]
    s_t = s_ptr + e64 * stride_se + n_ld[:, None] * stride_sn + g[None, :]  # [BN, BK/32]
    a_t = a_ptr + rows.to(tl.int64)[None, :] * K + kk[:, None]  # [BK, BM]
    acc = tl.zeros([BN, BM], tl.float32)
    for k0 in range(0, K, BK):
        at = tl.load(a_t + k0, mask=valid[None, :] & ((k0 + kk) < K)[:, None], other=0.0)
        acc = _v3_step(acc, at, w_t, s_t, g, k0, K, BN, BK, EVEN_K, X_FMT, SCALED)
    if LORA:
        acc = _lora_expand(acc, lb_ptr + e64 * stride_lbe, ls_ptr, rows, valid, n_ld, LW, "tf32")
    y = acc + tl.load(b_ptr + e64 * N + n_ld)[:, None]
    tl.store(
        y_ptr + rows.to(tl.int64)[None, :] * N + n[:, None],
        y.to(y_ptr.dtype.element_ty),
        mask=(n < N)[:, None] & valid[None, :],
    )


def _x_format(x: Tensor) -> str:
    if x.dtype not in _FORMATS:
        raise ValueError(f"the v3 MoE kernels take bfloat16 or float16 activations, got {x.dtype}")
    return _FORMATS[x.dtype]


def _scaled(x: Tensor) -> bool:
    return x.is_cuda and not triton.knobs.runtime.interpret  # the interpreter has no dot_scaled


def gate_up_v3(
    x: Tensor,
    r: Routing,
    w: MoEWeights,
    alpha: float,
    limit: float,
    tiles: Tiles,
    lora: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """gate_up on v3 weights (layout "v3"): act [T*k, I] in x.dtype."""
    (t, h), k = x.shape, r.ids.shape[1]
    e, _, i = w.shape
    fmt = _x_format(x)
    act = common._empty((t * k, i), x.dtype, x.device)
    largs, lkw = _lora_args(lora, x, planes=True)
    _gate_up_v3_kernel[_grid(t, k, e, i, tiles)](
        x,
        w.w13,
        w.s13,
        w.b13,
        act,
        r.counts,
        r.rows,
        *largs,
        t,
        x.stride(0),
        *w.w13.stride()[:3],
        *w.s13.stride()[:3],
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
        X_FMT=fmt,
        SCALED=_scaled(x),
        **lkw,
        num_warps=tiles.warps,
        num_stages=tiles.stages,
    )
    return act


def down_v3(
    act: Tensor, r: Routing, w: MoEWeights, tiles: Tiles, lora: tuple[Tensor, Tensor] | None = None
) -> Tensor:
    """down on v3 weights (layout "v3"): y [T*k, H] in act.dtype, rows in assignment order."""
    a, i = act.shape
    e, h, _ = w.shape
    t = r.ids.shape[0]
    fmt = _x_format(act)
    y = common._empty((a, h), act.dtype, act.device)
    largs, lkw = _lora_args(lora, act, planes=False)
    _down_v3_kernel[_grid(t, r.ids.shape[1], e, h, tiles)](
        act,
        w.w2,
        w.s2,
        w.b2,
        y,
        r.counts,
        r.rows,
        *largs,
        t,
        *w.w2.stride()[:2],
        *w.s2.stride()[:2],
        N=h,
        K=i,
        E=e,
        BE=triton.next_power_of_2(e),
        BM=tiles.bm,
        BN=tiles.bn,
        BK=tiles.bk,
        X_FMT=fmt,
        SCALED=_scaled(act),
        **lkw,
        num_warps=tiles.warps,
        num_stages=tiles.stages,
    )
    return y

"""The v3 MoE GEMMs for large batches, acc^T [BN, BM] = W [BN, BK] @ x^T [BK, BM] on wgmma with the
weights as its register operand, in two weight layouts (gptoss.kernels.moe_layout):

  "v3"   (SWZ): each 16-row x 64-K block of W stored as the 32 lanes' MMA fragments, 16 bytes a lane
         (_to_v3_layout), in v2's bits order; the kernel loads int32 words, dequantizes them with
         v2's rotate-and-mask (two scale factors a word: its rows g and g + 8) and a permute +
         reshape that is the identity on registers, so the tile is already in the wgmma operand
         layout: no convert_layout through shared memory in the K loop (checked in the sm_90a TTGIR).
  "v3ds" checkpoint nibble order, tl.dot_scaled(w, s, "e2m1", x, None, "bf16"), the simplest
         version: Triton 3.6 upcasts through a byte-wise LDS of the packed tile and a PRMT table,
         converts the scales through shared memory and waits for every wgmma; ~7 SASS a weight value
         a thread in the K loop at BK 64, ~9 at BK 128 (K 2880's masked tail leaves the x and weight
         loads out of the cp.async pipeline), against v2's ~5.5 and SWZ's ~3.7-4.1 (sm_90a, 20b).
"""

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
from gptoss.kernels.moe_v3_step import _v3_ptrs, _v3_step


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
    SCALED: tl.constexpr,
    SWZ: tl.constexpr,
    PREC: tl.constexpr,
    LORA: tl.constexpr,
    LW: tl.constexpr,
):
    """act[a, n] = swiglu(x[a // k] @ W13_e^T + b13_e) for the rows a of tile pid_m; N = I, K = H."""
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    e, rows, valid, n_tiles = _expert_tile(counts_ptr, rows_ptr, T, pid_m, E, BE, BM)
    if pid_m >= n_tiles:
        return
    EVEN_K: tl.constexpr = ((K + 63) // 64 * 64 if SWZ else K) % BK == 0  # SWZ: K padded to 64
    n = pid_n * BN + tl.arange(0, BN)  # [BN] act columns = weight-row pairs
    n_ld = n % N  # past-the-end columns reload valid rows; never stored
    kk = tl.arange(0, BK)
    e64 = e.to(tl.int64)
    w_g, s_g, g = _v3_ptrs(
        w_ptr + e64 * stride_we, s_ptr + e64 * stride_se, pid_n * BN, stride_wn, stride_sn, N, BN, BK, SWZ
    )
    x_t = x_ptr + (rows // TOP_K).to(tl.int64)[None, :] * stride_x + kk[:, None]  # [BK, BM]
    acc_g = tl.zeros([BN, BM], tl.float32)
    acc_u = tl.zeros([BN, BM], tl.float32)
    for k0 in range(0, K, BK):
        xt = tl.load(x_t + k0, mask=valid[None, :] & ((k0 + kk) < K)[:, None], other=0.0)
        acc_g = _v3_step(acc_g, xt, w_g, s_g, g, k0, K, BN, BK, EVEN_K, SCALED, SWZ, PREC)
        acc_u = _v3_step(
            acc_u, xt, w_g + stride_wp, s_g + stride_sp, g, k0, K, BN, BK, EVEN_K, SCALED, SWZ, PREC
        )
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
    SCALED: tl.constexpr,
    SWZ: tl.constexpr,
    PREC: tl.constexpr,
    LORA: tl.constexpr,
    LW: tl.constexpr,
):
    """y[a, n] = act[a] @ W2_e^T + b2_e for the rows a of tile pid_m; N = H, K = I."""
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    e, rows, valid, n_tiles = _expert_tile(counts_ptr, rows_ptr, T, pid_m, E, BE, BM)
    if pid_m >= n_tiles:
        return
    EVEN_K: tl.constexpr = ((K + 63) // 64 * 64 if SWZ else K) % BK == 0
    n = pid_n * BN + tl.arange(0, BN)
    n_ld = n % N
    kk = tl.arange(0, BK)
    e64 = e.to(tl.int64)
    w_t, s_t, g = _v3_ptrs(
        w_ptr + e64 * stride_we, s_ptr + e64 * stride_se, pid_n * BN, stride_wn, stride_sn, N, BN, BK, SWZ
    )
    a_t = a_ptr + rows.to(tl.int64)[None, :] * K + kk[:, None]  # [BK, BM]
    acc = tl.zeros([BN, BM], tl.float32)
    for k0 in range(0, K, BK):
        at = tl.load(a_t + k0, mask=valid[None, :] & ((k0 + kk) < K)[:, None], other=0.0)
        acc = _v3_step(acc, at, w_t, s_t, g, k0, K, BN, BK, EVEN_K, SCALED, SWZ, PREC)
    if LORA:
        acc = _lora_expand(acc, lb_ptr + e64 * stride_lbe, ls_ptr, rows, valid, n_ld, LW, PREC)
    y = acc + tl.load(b_ptr + e64 * N + n_ld)[:, None]
    tl.store(
        y_ptr + rows.to(tl.int64)[None, :] * N + n[:, None],
        y.to(y_ptr.dtype.element_ty),
        mask=(n < N)[:, None] & valid[None, :],
    )


def _check(x: Tensor, w: MoEWeights) -> None:
    if x.dtype not in (torch.bfloat16, torch.float32):  # float32: exact greedy tests, not speed
        raise ValueError(f"the v3 MoE kernels take bfloat16 or float32 activations, got {x.dtype}")
    if w.layout not in ("v3", "v3ds"):
        raise ValueError(
            f"the v3 MoE kernels need weights prepared with kernels='v3' or 'v3ds', got {w.layout!r}"
        )


def _scaled(x: Tensor, swz: bool) -> bool:
    """SWZ: the PTX dequant (CUDA); else tl.dot_scaled, whose x operand is "bf16" here."""
    cuda = x.is_cuda and not triton.knobs.runtime.interpret  # the interpreter runs neither
    return cuda and (swz or x.dtype == torch.bfloat16)


def _weight_args(blocks: Tensor, scales: Tensor, swz: bool) -> tuple[Tensor, Tensor, list[int], list[int]]:
    """Weights [..., N, K/2] and scales [..., N, G] uint8 -> the kernel's tensors and their strides
    (leading dims, then N). SWZ: int32 words, strides in words, N's stride per 16-row block."""
    if not swz:
        return blocks, scales, list(blocks.stride()[:-1]), list(scales.stride()[:-1])
    words = blocks.view(torch.int32)  # [..., N, K/8]
    s_words = scales.reshape(-1).view(torch.int32)  # flat: a row's G bytes need not fill words
    w_strides = [*words.stride()[:-2], 16 * words.stride(-2)]
    s_strides = [st // 4 for st in scales.stride()[:-2]] + [16 * scales.stride(-2) // 4]
    return words, s_words, w_strides, s_strides


def gate_up_v3(
    x: Tensor,
    r: Routing,
    w: MoEWeights,
    alpha: float,
    limit: float,
    tiles: Tiles,
    lora: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """gate_up on v3 weights (layout "v3" or "v3ds"): act [T*k, I] in x.dtype."""
    (t, h), k = x.shape, r.ids.shape[1]
    e, _, i = w.shape
    _check(x, w)
    swz = w.layout == "v3"
    w13, s13, w_strides, s_strides = _weight_args(w.w13, w.s13, swz)
    act = common._empty((t * k, i), x.dtype, x.device)
    largs, lkw = _lora_args(lora, x, planes=True)
    _gate_up_v3_kernel[_grid(t, k, e, i, tiles)](
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
        *w_strides,
        *s_strides,
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
        SCALED=_scaled(x, swz),
        SWZ=swz,
        PREC=_precision(x),
        **lkw,
        num_warps=tiles.warps,
        num_stages=tiles.stages,
    )
    return act


def down_v3(
    act: Tensor, r: Routing, w: MoEWeights, tiles: Tiles, lora: tuple[Tensor, Tensor] | None = None
) -> Tensor:
    """down on v3 weights (layout "v3" or "v3ds"): y [T*k, H] in act.dtype, rows in assignment order."""
    a, i = act.shape
    e, h, _ = w.shape
    t = r.ids.shape[0]
    _check(act, w)
    swz = w.layout == "v3"
    w2, s2, w_strides, s_strides = _weight_args(w.w2, w.s2, swz)
    y = common._empty((a, h), act.dtype, act.device)
    largs, lkw = _lora_args(lora, act, planes=False)
    _down_v3_kernel[_grid(t, r.ids.shape[1], e, h, tiles)](
        act,
        w2,
        s2,
        w.b2,
        y,
        r.counts,
        r.rows,
        *largs,
        t,
        *w_strides,
        *s_strides,
        N=h,
        K=i,
        E=e,
        BE=triton.next_power_of_2(e),
        BM=tiles.bm,
        BN=tiles.bn,
        BK=tiles.bk,
        SCALED=_scaled(act, swz),
        SWZ=swz,
        PREC=_precision(act),
        **lkw,
        num_warps=tiles.warps,
        num_stages=tiles.stages,
    )
    return y

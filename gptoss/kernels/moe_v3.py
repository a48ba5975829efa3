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

gate_up's W13 comes with gate and up rows interleaved by 8 in both layouts (moe_layout._interleave8):
a program's 2*BN weight rows are one dot, and the wgmma accumulator holds gate row 8b + g and its up
row in one thread (rows g and g + 8 of a fragment), so the SwiGLU pairs them in registers. One dot
of 2*BN rows instead of two of BN lets a warpgroup own 64 rows at half the columns: 8 warps reach
BM 256 at 128 accumulator registers a thread (a tile per expert up to 256 rows: each weight
dequantized once where BM 128 passes twice). Tiles.half: a tile with <= BM/2 rows runs a BM/2 body.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from gptoss.kernels import moe_common as common
from gptoss.kernels.moe_common import _expert_tile_at, _lora_args, _lora_expand, _precision, _tile_rows
from gptoss.kernels.moe_layout import MoEWeights
from gptoss.kernels.moe_routing import Routing
from gptoss.kernels.moe_tiles import Tiles, _grid
from gptoss.kernels.moe_v3_step import _v3_ptrs, _v3_step


@triton.jit
def _gate_up_v3_tile(
    x_ptr,
    w_g,
    s_g,
    g,
    b_e,
    act_ptr,
    rows_ptr,
    lb_e,
    ls_ptr,
    stride_lbp,
    e,
    slot0,
    n_rows,
    pid_n,
    T,
    stride_x,
    alpha,
    limit,
    N: tl.constexpr,
    K: tl.constexpr,
    TOP_K: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    EVEN_K: tl.constexpr,
    SCALED: tl.constexpr,
    SWZ: tl.constexpr,
    PREC: tl.constexpr,
    LORA: tl.constexpr,
    LW: tl.constexpr,
):
    """One tile: act[rows, pid_n's BN columns] = swiglu(x[rows // k] @ W13_e^T + b13_e), BM rows from
    slot0. The 2*BN weight rows are gate and up interleaved by 8 (moe_layout._interleave8), one dot."""
    rows, valid = _tile_rows(rows_ptr, T, e, slot0, n_rows, BM)
    kk = tl.arange(0, BK)
    x_t = x_ptr + (rows // TOP_K).to(tl.int64)[None, :] * stride_x + kk[:, None]  # [BK, BM]
    acc = tl.zeros([2 * BN, BM], tl.float32)
    for k0 in range(0, K, BK):
        xt = tl.load(x_t + k0, mask=valid[None, :] & ((k0 + kk) < K)[:, None], other=0.0)
        acc = _v3_step(acc, xt, w_g, s_g, g, k0, K, 2 * BN, BK, EVEN_K, SCALED, SWZ, PREC)
    r = tl.arange(0, 2 * BN)  # acc row r: plane (r // 8) % 2, act column pid_n * BN + (r // 16) * 8 + r % 8
    plane = (r // 8) % 2
    col = (pid_n * BN + (r // 16) * 8 + r % 8) % N  # past-the-end columns read valid rows; never stored
    if LORA:  # + B_e @ s^T: B's planes [2, N, LW] are contiguous, so plane p's row c is row p N + c
        acc = _lora_expand(acc, lb_e, ls_ptr, rows, valid, plane * (stride_lbp // LW) + col, LW, PREC)
    acc += tl.load(b_e + plane * N + col)[:, None]
    # rows 16b + 8h + g -> [b, g, BM, h]: h sits in a thread's registers (the fragment's rows g, g + 8)
    gate, up = tl.split(tl.permute(tl.reshape(acc, (2 * BN // 16, 2, 8, BM)), (0, 2, 3, 1)))
    gate = tl.minimum(tl.reshape(gate, (BN, BM)), limit)  # act column pid_n * BN + 8b + g
    up = tl.minimum(tl.maximum(tl.reshape(up, (BN, BM)), -limit), limit)
    act = (up + 1.0) * (gate * tl.sigmoid(alpha * gate))
    n = pid_n * BN + tl.arange(0, BN)
    tl.store(
        act_ptr + rows.to(tl.int64)[None, :] * N + n[:, None],
        act.to(act_ptr.dtype.element_ty),
        mask=(n < N)[:, None] & valid[None, :],
    )


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
    stride_wn,
    stride_se,
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
    HALF: tl.constexpr,
    SCALED: tl.constexpr,
    SWZ: tl.constexpr,
    PREC: tl.constexpr,
    LORA: tl.constexpr,
    LW: tl.constexpr,
):
    """act[a, n] = swiglu(x[a // k] @ W13_e^T + b13_e) for the rows a of tile pid_m; N = I, K = H.
    HALF: a tile with <= BM/2 rows runs the BM/2 body (its weights still pass once)."""
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    e, slot0, n_rows, n_tiles = _expert_tile_at(counts_ptr, pid_m, E, BE, BM)
    if pid_m >= n_tiles:
        return
    EVEN_K: tl.constexpr = ((K + 63) // 64 * 64 if SWZ else K) % BK == 0  # SWZ: K padded to 64
    e64 = e.to(tl.int64)
    w_g, s_g, g = _v3_ptrs(
        w_ptr + e64 * stride_we,
        s_ptr + e64 * stride_se,
        pid_n * 2 * BN,
        stride_wn,
        stride_sn,
        2 * N,
        2 * BN,
        BK,
        SWZ,
    )
    args = (
        w_g,
        s_g,
        g,
        b_ptr + e64 * 2 * N,
        act_ptr,
        rows_ptr,
        lb_ptr + e64 * stride_lbe,
        ls_ptr,
        stride_lbp,
    )
    if HALF and n_rows - slot0 <= BM // 2:
        _gate_up_v3_tile(
            x_ptr, *args, e, slot0, n_rows, pid_n, T, stride_x, alpha, limit,
            N, K, TOP_K, BM // 2, BN, BK, EVEN_K, SCALED, SWZ, PREC, LORA, LW,
        )  # fmt: skip
    else:
        _gate_up_v3_tile(
            x_ptr, *args, e, slot0, n_rows, pid_n, T, stride_x, alpha, limit,
            N, K, TOP_K, BM, BN, BK, EVEN_K, SCALED, SWZ, PREC, LORA, LW,
        )  # fmt: skip


@triton.jit
def _down_v3_tile(
    a_ptr,
    w_t,
    s_t,
    g,
    bias,
    y_ptr,
    rows_ptr,
    lb_e,
    ls_ptr,
    n_ld,
    e,
    slot0,
    n_rows,
    n,
    T,
    N: tl.constexpr,
    K: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    EVEN_K: tl.constexpr,
    SCALED: tl.constexpr,
    SWZ: tl.constexpr,
    PREC: tl.constexpr,
    LORA: tl.constexpr,
    LW: tl.constexpr,
):
    """One tile: y[rows, n] = act[rows] @ W2_e[n]^T + bias, BM rows from slot0."""
    rows, valid = _tile_rows(rows_ptr, T, e, slot0, n_rows, BM)
    kk = tl.arange(0, BK)
    a_t = a_ptr + rows.to(tl.int64)[None, :] * K + kk[:, None]  # [BK, BM]
    acc = tl.zeros([BN, BM], tl.float32)
    for k0 in range(0, K, BK):
        at = tl.load(a_t + k0, mask=valid[None, :] & ((k0 + kk) < K)[:, None], other=0.0)
        acc = _v3_step(acc, at, w_t, s_t, g, k0, K, BN, BK, EVEN_K, SCALED, SWZ, PREC)
    if LORA:
        acc = _lora_expand(acc, lb_e, ls_ptr, rows, valid, n_ld, LW, PREC)
    tl.store(
        y_ptr + rows.to(tl.int64)[None, :] * N + n[:, None],
        (acc + bias).to(y_ptr.dtype.element_ty),
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
    HALF: tl.constexpr,
    SCALED: tl.constexpr,
    SWZ: tl.constexpr,
    PREC: tl.constexpr,
    LORA: tl.constexpr,
    LW: tl.constexpr,
):
    """y[a, n] = act[a] @ W2_e^T + b2_e for the rows a of tile pid_m; N = H, K = I. HALF as gate_up's."""
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    e, slot0, n_rows, n_tiles = _expert_tile_at(counts_ptr, pid_m, E, BE, BM)
    if pid_m >= n_tiles:
        return
    EVEN_K: tl.constexpr = ((K + 63) // 64 * 64 if SWZ else K) % BK == 0
    n = pid_n * BN + tl.arange(0, BN)
    n_ld = n % N
    e64 = e.to(tl.int64)
    w_t, s_t, g = _v3_ptrs(
        w_ptr + e64 * stride_we, s_ptr + e64 * stride_se, pid_n * BN, stride_wn, stride_sn, N, BN, BK, SWZ
    )
    bias = tl.load(b_ptr + e64 * N + n_ld)[:, None]  # [BN, 1]
    args = (
        w_t,
        s_t,
        g,
        bias,
        y_ptr,
        rows_ptr,
        lb_ptr + e64 * stride_lbe,
        ls_ptr,
        n_ld,
        e,
        slot0,
        n_rows,
        n,
        T,
    )
    if HALF and n_rows - slot0 <= BM // 2:
        _down_v3_tile(a_ptr, *args, N, K, BM // 2, BN, BK, EVEN_K, SCALED, SWZ, PREC, LORA, LW)
    else:
        _down_v3_tile(a_ptr, *args, N, K, BM, BN, BK, EVEN_K, SCALED, SWZ, PREC, LORA, LW)


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
    """gate_up on v3 weights (layout "v3" or "v3ds"): act [T*k, I] in x.dtype. lora: (B planes
    [E, 2, I, W] contiguous, the shrunk rows [T*k, W])."""
    (t, h), k = x.shape, r.ids.shape[1]
    e, _, i = w.shape
    _check(x, w)
    if lora is not None and not lora[0].is_contiguous():
        raise ValueError("gate_up_v3: the LoRA B planes must be contiguous (plane p's row c is row p*I + c)")
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
        HALF=tiles.half,
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
        HALF=tiles.half,
        SCALED=_scaled(act, swz),
        SWZ=swz,
        PREC=_precision(act),
        **lkw,
        num_warps=tiles.warps,
        num_stages=tiles.stages,
    )
    return y

"""The v1 MoE GEMMs: MXFP4 weights in the checkpoint's nibble order, dequantized in-kernel (gate_up with
the clamped SwiGLU fused, down with its bias); see gptoss.kernels.moe for the whole forward."""

from __future__ import annotations

from dataclasses import replace

import triton
import triton.language as tl
from torch import Tensor

from gptoss.kernels import moe_common as common
from gptoss.kernels.moe_common import _expert_tile, _lora_args, _lora_expand, _precision
from gptoss.kernels.moe_layout import MoEWeights
from gptoss.kernels.moe_routing import Routing
from gptoss.kernels.moe_tiles import Tiles, _grid

# 4 packed bytes (8 e2m1 codes) -> 4 bf16x2 words: $0, $1 the low nibbles of bytes 0-1, 2-3 and
# $2, $3 the high ones (element i of an output comes from byte i, so any register layout works).
# prmt spreads two bytes into the 16-bit halves of a word; per half, one multiply moves a nibble's
# 3 magnitude bits to 8:6 (bf16's low exponent bits and top mantissa bit) and its sign to 15,
# which reads as e2m1 * 2^-126 (code 1, i.e. 0.5, a bf16 subnormal); mul.bf16x2 by 2^126 (0x7E80)
# makes it exact e2m1. The nibble is masked first, so the two shifted copies cannot carry.
_E2M1_TO_BF16_ASM: tl.constexpr = tl.constexpr("""
{
.reg .b32 t01, t23, m, bias;
mov.b32 bias, 0x7E807E80;
prmt.b32 t01, $4, 0, 0x4140;
prmt.b32 t23, $4, 0, 0x4342;
and.b32 m, t01, 0x000F000F; mul.lo.u32 m, m, 0x1040; and.b32 m, m, 0x81C081C0;
mul.rn.bf16x2 $0, m, bias;
and.b32 m, t23, 0x000F000F; mul.lo.u32 m, m, 0x1040; and.b32 m, m, 0x81C081C0;
mul.rn.bf16x2 $1, m, bias;
and.b32 m, t01, 0x00F000F0; mul.lo.u32 m, m, 0x0104; and.b32 m, m, 0x81C081C0;
mul.rn.bf16x2 $2, m, bias;
and.b32 m, t23, 0x00F000F0; mul.lo.u32 m, m, 0x0104; and.b32 m, m, 0x81C081C0;
mul.rn.bf16x2 $3, m, bias;
}
""")


@triton.jit
def _dequant(b, s, BN: tl.constexpr, BK: tl.constexpr, dtype: tl.constexpr, ASM: tl.constexpr):
    """b [BN, BK/32, 16] uint8, s [BN, BK/32] uint8 e8m0 -> [BN, BK] in dtype, exactly.

    ASM (CUDA): _E2M1_TO_BF16_ASM, two values per 32-bit op, then a bf16x2 multiply by the scale
    2^(s - 127): ~5 SASS instructions a value with the MMA operand shuffles, against ~9 for the
    portable path; decode needs ~26 values per SM-cycle (3 TB/s) from 128 lanes. Portable (the
    interpreter runs no PTX): the 3 magnitude bits go where fp16's low exponent bits and top
    mantissa bit are, the sign to bit 15, giving e2m1 * 2^-14 (0.5 an fp16 subnormal, converted
    exactly), times 2^(s - 127 + 14) in float32.
    """
    if ASM:
        lo, hi = tl.inline_asm_elementwise(
            _E2M1_TO_BF16_ASM, "=r,=r,=r,=r,r", [b], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4
        )
        scale = (s.to(tl.uint16) << 7).to(tl.bfloat16, bitcast=True)[:, :, None]  # [BN, BK/32, 1]
    else:
        b = b.to(tl.int32)
        lo = ((b << 9) & 0x0E00) | ((b << 12) & 0x8000)
        hi = ((b << 5) & 0x0E00) | ((b << 8) & 0x8000)
        lo = lo.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
        hi = hi.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
        scale = ((s.to(tl.int32) + 14) << 23).to(tl.float32, bitcast=True)[:, :, None]
    w = tl.join(lo * scale, hi * scale)  # [BN, BK/32, 16, 2]: low nibble first
    return tl.reshape(w, (BN, BK)).to(dtype)


@triton.jit(do_not_specialize=["T"])  # T changes every step: no recompiles on its value
def _gate_up_kernel(
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
    N,
    K,
    stride_x,
    stride_we,
    stride_wp,
    stride_wn,
    stride_se,
    stride_sp,
    stride_sn,
    alpha,
    limit,
    TOP_K: tl.constexpr,
    E: tl.constexpr,
    BE: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    EVEN_K: tl.constexpr,
    PREC: tl.constexpr,
    ASM: tl.constexpr,
    LORA: tl.constexpr,
    LW: tl.constexpr,
):
    """act[a, n] = swiglu(x[a // k] @ W13_e^T + b13_e) for the rows a of tile pid_m; N = I, K = H."""
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    e, rows, valid, n_tiles = _expert_tile(counts_ptr, rows_ptr, T, pid_m, E, BE, BM)
    if pid_m >= n_tiles:
        return
    G: tl.constexpr = BK // 32
    n = pid_n * BN + tl.arange(0, BN)  # [BN] act columns = weight-row pairs
    n_ok = n < N
    n_ld = n % N  # past-the-end columns reload valid rows; never stored
    g, j, kk = tl.arange(0, G), tl.arange(0, 16), tl.arange(0, BK)
    e64 = e.to(tl.int64)
    w_gate = (
        w_ptr + e64 * stride_we + n_ld[:, None, None] * stride_wn + g[None, :, None] * 16 + j[None, None, :]
    )  # [BN, G, 16]
    s_gate = s_ptr + e64 * stride_se + n_ld[:, None] * stride_sn + g[None, :]  # [BN, G]
    x_rows = x_ptr + (rows // TOP_K).to(tl.int64)[None, :] * stride_x + kk[:, None]  # [BK, BM]
    acc_g = tl.zeros([BN, BM], tl.float32)
    acc_u = tl.zeros([BN, BM], tl.float32)
    for k0 in range(0, K, BK):
        if EVEN_K:
            xt = tl.load(x_rows + k0)
            bg = tl.load(w_gate + k0 // 2)
            bu = tl.load(w_gate + stride_wp + k0 // 2)
            sg = tl.load(s_gate + k0 // 32)
            su = tl.load(s_gate + stride_sp + k0 // 32)
        else:  # K tail: zero weights and zero x past K
            g_ok = (k0 // 32 + g) < K // 32
            xt = tl.load(x_rows + k0, mask=(k0 + kk < K)[:, None], other=0.0)
            bg = tl.load(w_gate + k0 // 2, mask=g_ok[None, :, None], other=0)
            bu = tl.load(w_gate + stride_wp + k0 // 2, mask=g_ok[None, :, None], other=0)
            sg = tl.load(s_gate + k0 // 32, mask=g_ok[None, :], other=0)
            su = tl.load(s_gate + stride_sp + k0 // 32, mask=g_ok[None, :], other=0)
        acc_g = tl.dot(_dequant(bg, sg, BN, BK, xt.dtype, ASM), xt, acc_g, input_precision=PREC)
        acc_u = tl.dot(_dequant(bu, su, BN, BK, xt.dtype, ASM), xt, acc_u, input_precision=PREC)
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
        mask=n_ok[:, None] & valid[None, :],
    )


@triton.jit(do_not_specialize=["T"])  # T changes every step: no recompiles on its value
def _down_kernel(
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
    N,
    K,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    E: tl.constexpr,
    BE: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    EVEN_K: tl.constexpr,
    PREC: tl.constexpr,
    ASM: tl.constexpr,
    LORA: tl.constexpr,
    LW: tl.constexpr,
):
    """y[a, n] = act[a] @ W2_e^T + b2_e for the rows a of tile pid_m; N = H, K = I."""
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    e, rows, valid, n_tiles = _expert_tile(counts_ptr, rows_ptr, T, pid_m, E, BE, BM)
    if pid_m >= n_tiles:
        return
    G: tl.constexpr = BK // 32
    n = pid_n * BN + tl.arange(0, BN)
    n_ok = n < N
    n_ld = n % N
    g, j, kk = tl.arange(0, G), tl.arange(0, 16), tl.arange(0, BK)
    e64 = e.to(tl.int64)
    w_rows = (
        w_ptr + e64 * stride_we + n_ld[:, None, None] * stride_wn + g[None, :, None] * 16 + j[None, None, :]
    )  # [BN, G, 16]
    s_rows = s_ptr + e64 * stride_se + n_ld[:, None] * stride_sn + g[None, :]  # [BN, G]
    a_rows = a_ptr + rows.to(tl.int64)[None, :] * K + kk[:, None]  # [BK, BM]
    acc = tl.zeros([BN, BM], tl.float32)
    for k0 in range(0, K, BK):
        if EVEN_K:
            at = tl.load(a_rows + k0)
            bw = tl.load(w_rows + k0 // 2)
            sw = tl.load(s_rows + k0 // 32)
        else:
            g_ok = (k0 // 32 + g) < K // 32
            at = tl.load(a_rows + k0, mask=(k0 + kk < K)[:, None], other=0.0)
            bw = tl.load(w_rows + k0 // 2, mask=g_ok[None, :, None], other=0)
            sw = tl.load(s_rows + k0 // 32, mask=g_ok[None, :], other=0)
        acc = tl.dot(_dequant(bw, sw, BN, BK, at.dtype, ASM), at, acc, input_precision=PREC)
    if LORA:
        acc = _lora_expand(acc, lb_ptr + e64 * stride_lbe, ls_ptr, rows, valid, n_ld, LW, PREC)
    y = acc + tl.load(b_ptr + e64 * N + n_ld)[:, None]
    tl.store(
        y_ptr + rows.to(tl.int64)[None, :] * N + n[:, None],
        y.to(y_ptr.dtype.element_ty),
        mask=n_ok[:, None] & valid[None, :],
    )


def gate_up(
    x: Tensor,
    r: Routing,
    w: MoEWeights,
    alpha: float,
    limit: float,
    tiles: Tiles,
    lora: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """x [T, H] -> act [T*k, I] in x.dtype (row t*k + j: token t through its j-th expert). lora: (B
    planes [E, 2, I, W], the rows' shrunk x [T*k, W]) adds their LoRA delta before the SwiGLU."""
    (t, h), k = x.shape, r.ids.shape[1]
    e, _, i = w.shape
    act = common._empty((t * k, i), x.dtype, x.device)
    largs, lkw = _lora_args(lora, x, planes=True)
    _gate_up_kernel[_grid(t, k, e, i, tiles)](
        x,
        w.w13,
        w.s13,
        w.b13,
        act,
        r.counts,
        r.rows,
        *largs,
        t,
        i,
        h,
        x.stride(0),
        *w.w13.stride()[:3],
        *w.s13.stride()[:3],
        alpha,
        limit,
        TOP_K=k,
        E=e,
        BE=triton.next_power_of_2(e),
        BM=tiles.bm,
        BN=tiles.bn,
        BK=tiles.bk,
        EVEN_K=h % tiles.bk == 0,
        PREC=_precision(x),
        ASM=common._use_asm(x),
        **lkw,
        num_warps=tiles.warps,
        num_stages=tiles.stages,
    )
    return act


def racy_portable_down(tiles: Tiles) -> bool:
    """Whether _down_kernel compiled with the portable dequant (moe_common.USE_ASM off) races on these
    tiles. On an H200 (bench/results v61, bench/kernels/moe_v1_repeat_gpu.py; 20b's shapes, T 4096),
    choose_tiles' down for 128 rows an expert (BM 128, BN 128, BK 64, 8 warps, 3 stages) gave 9
    distinct outputs in 10 runs of one input: inf and ~1e37 in 8-column groups of whole tiles' rows,
    the signature of moe_v3.racy_pointer_down's tiles. One output, close to the PTX dequant's, with
    the PTX dequant on the same tiles, and portable at BK 128, at 2 stages, at BM 64, on 4 warps or
    on 64 columns. The cause (Triton's 3-stage cp.async pipeline here) is not found yet: the sm_90a PTX of
    this compile and of the safe ones (the PTX dequant; 2 stages) has the same barriers, cp.async groups
    and wgmma waits, and its one layout conversion in the loop (the scales) stays inside each warp
    (bench/results v62), so no barrier Triton placed is missing."""
    return tiles.bm == 128 and tiles.bk == 64 and tiles.warps == 8 and tiles.stages >= 3


def down(
    act: Tensor, r: Routing, w: MoEWeights, tiles: Tiles, lora: tuple[Tensor, Tensor] | None = None
) -> Tensor:
    """act [T*k, I] -> y [T*k, H] in act.dtype, bias added, not yet weighted. lora: (B [E, H, W], the
    rows' shrunk act [T*k, W]) adds their LoRA delta. Compiled with the portable dequant, tiles that
    race there (racy_portable_down) run 2 stages deep instead."""
    a, i = act.shape
    e, h, _ = w.shape
    t = r.ids.shape[0]
    asm = common._use_asm(act)
    if not asm and common.compiled(act) and racy_portable_down(tiles):
        tiles = replace(tiles, stages=2)
    y = common._empty((a, h), act.dtype, act.device)
    largs, lkw = _lora_args(lora, act, planes=False)
    _down_kernel[_grid(t, r.ids.shape[1], e, h, tiles)](
        act,
        w.w2,
        w.s2,
        w.b2,
        y,
        r.counts,
        r.rows,
        *largs,
        t,
        h,
        i,
        *w.w2.stride()[:2],
        *w.s2.stride()[:2],
        E=e,
        BE=triton.next_power_of_2(e),
        BM=tiles.bm,
        BN=tiles.bn,
        BK=tiles.bk,
        EVEN_K=i % tiles.bk == 0,
        PREC=_precision(act),
        ASM=asm,
        **lkw,
        num_warps=tiles.warps,
        num_stages=tiles.stages,
    )
    return y

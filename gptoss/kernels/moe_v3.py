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
from gptoss.kernels.moe_v1 import _dequant

# A v3 word (v2's bits layout of bytes j = 2q + h: row g + 8h, K 2t + 8q + (0, 1)) and the bf16x2
# factors 2^(s-1) of rows g (f0) and g + 8 (f1) -> the 4 bf16x2 registers of one k16 MMA fragment:
# v2's 9 integer ops, then registers 0 and 2 (h = 0) times f0, 1 and 3 times f1.
_V3_ASM: tl.constexpr = tl.constexpr("""
{
.reg .b32 a, b, c, d, e, f, g;
mov.b32 f, $5; mov.b32 g, $6;
shl.b32 a, $4, 4; and.b32 a, a, 0x81C081C0; mul.rn.bf16x2 a, a, f;
shf.l.wrap.b32 b, $4, $4, 10; and.b32 b, b, 0x81C081C0; mul.rn.bf16x2 b, b, g;
shf.l.wrap.b32 c, $4, $4, 14; and.b32 c, c, 0x81C081C0; mul.rn.bf16x2 c, c, f;
shl.b32 d, $4, 8; and.b32 d, d, 0x01000100; and.b32 e, $4, 0x80C080C0; or.b32 d, d, e; mul.rn.bf16x2 d, d, g;
mov.b32 $0, a; mov.b32 $1, b; mov.b32 $2, c; mov.b32 $3, d;
}
""")


@triton.jit
def _dequant_v3(w, sw, RB: tl.constexpr, KC: tl.constexpr, dtype: tl.constexpr, ASM: tl.constexpr):
    """w [RB, KC, 8, 4, 4] int32 (16-row block, 64-K chunk, lane g, lane t, k16 step s), sw [RB, KC, 8]
    int32 (bytes 2 s2 + h: the scale of rows g + 8h, K 32 s2..) -> W [RB*16, KC*64] in dtype, exactly.

    Portable (the interpreter runs no PTX): the same registers by shifts, each bf16-placed value moved
    to fp16's bits (e2m1 * 2^-14, exact in float32), times 2^(s - 127 + 14) in float32."""
    w = tl.reshape(w.to(tl.uint32, bitcast=True), (RB, KC, 8, 4, 2, 2))  # [rb, kc, g, t, s2, s1]
    sw = sw.to(tl.uint32, bitcast=True)
    s0 = tl.join(sw & 0xFF, (sw >> 16) & 0xFF)  # [RB, KC, 8, 2 (s2)] rows g
    s1 = tl.join((sw >> 8) & 0xFF, sw >> 24)  # rows g + 8
    if ASM:
        f0 = tl.broadcast_to((s0 * 0x800080 + 0x3F003F00)[:, :, :, None, :, None], (RB, KC, 8, 4, 2, 2))
        f1 = tl.broadcast_to((s1 * 0x800080 + 0x3F003F00)[:, :, :, None, :, None], (RB, KC, 8, 4, 2, 2))
        r0, r1, r2, r3 = tl.inline_asm_elementwise(
            _V3_ASM,
            "=r,=r,=r,=r,r,r,r",
            [w, f0, f1],
            dtype=(tl.uint32, tl.uint32, tl.uint32, tl.uint32),
            is_pure=True,
            pack=1,
        )
    else:
        r0 = (w << 4) & 0x81C081C0
        r1 = ((w << 10) | (w >> 22)) & 0x81C081C0
        r2 = ((w << 14) | (w >> 18)) & 0x81C081C0
        r3 = (w & 0x80C080C0) | ((w << 8) & 0x01000100)
    q = tl.join(tl.join(r0, r1), tl.join(r2, r3))  # [rb, kc, g, t, s2, s1, h, q]: register 2q + h
    if ASM:
        lo = (q & 0xFFFF).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        hi = (q >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        v = tl.join(lo, hi)  # [rb, kc, g, t, s2, s1, h, q, nib]
    else:
        v = tl.join(q & 0xFFFF, q >> 16)
        v = ((v & 0x8000) | ((v & 0x01C0) << 3)).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
        sc = ((tl.join(s0, s1).to(tl.int32) + 14) << 23).to(tl.float32, bitcast=True)  # [.., s2, h]
        v = v * sc[:, :, :, None, :, None, :, None, None]
    v = tl.permute(v, (0, 6, 2, 1, 4, 5, 7, 3, 8))  # [rb, h, g, kc, s2, s1, q, t, nib]
    return tl.reshape(v, (RB * 16, KC * 64)).to(dtype)  # row 16 rb + 8h + g, K 64 kc + 16 s + 8q + 2t + nib


@triton.jit
def _v3_ptrs(
    w_base,
    s_base,
    n0,
    stride_wn,
    stride_sn,
    N: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    SWZ: tl.constexpr,
):
    """The weight and scale tile pointers at k0 = 0 and their K-chunk index (for the tail mask).
    SWZ: int32 words [BN/16, BK/64, 8, 4, 4] and scale words [BN/16, BK/64, 8] (strides per 16-row
    block); else bytes [BN, BK/2] and scales [BN, BK/32] (strides per row)."""
    if SWZ:
        tl.static_assert(BK % 64 == 0 and BN % 16 == 0, "v3 weights come in 16-row x 64-K blocks")
        RB: tl.constexpr = BN // 16
        KC: tl.constexpr = BK // 64
        rb = (n0 // 16 + tl.arange(0, RB)) % (N // 16)  # past-the-end blocks reload valid rows
        kc = tl.arange(0, KC)
        lane = tl.reshape(tl.arange(0, 128), (8, 4, 4))  # (g, t, s): 16 bytes a lane
        w = w_base + rb[:, None, None, None, None] * stride_wn + kc[None, :, None, None, None] * 128
        w = w + lane[None, None, :, :, :]
        s = s_base + rb[:, None, None] * stride_sn + kc[None, :, None] * 8 + tl.arange(0, 8)[None, None, :]
        return w, s, kc
    else:
        n_ld = (n0 + tl.arange(0, BN)) % N
        g = tl.arange(0, BK // 32)
        w = w_base + n_ld[:, None] * stride_wn + tl.arange(0, BK // 2)[None, :]
        s = s_base + n_ld[:, None] * stride_sn + g[None, :]
        return w, s, g


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
    SCALED: tl.constexpr,
    SWZ: tl.constexpr,
    PREC: tl.constexpr,
):
    """acc [BN, BM] += W[:, k0:k0+BK] [BN, BK] @ x [BK, BM] (see _v3_ptrs for the pointers; g: their
    K-chunk index). SWZ: _dequant_v3 and tl.dot (SCALED: its PTX). Else tl.dot_scaled on bytes (low
    nibble first) and e8m0 scales if SCALED (CUDA), or the interpreter's stand-in: the same bytes
    dequantized by v1's portable path and a plain tl.dot."""
    if SWZ:
        KC: tl.constexpr = BK // 64
        if EVEN_K:
            w = tl.load(w_ptrs + (k0 // 64) * 128)
            s = tl.load(s_ptrs + (k0 // 64) * 8)
        else:  # past the padded K: whole 64-K chunks, masked (zero words decode to zeros)
            c_ok = (k0 // 64 + g) < (K + 63) // 64  # [KC]
            w = tl.load(w_ptrs + (k0 // 64) * 128, mask=c_ok[None, :, None, None, None], other=0)
            s = tl.load(s_ptrs + (k0 // 64) * 8, mask=c_ok[None, :, None], other=0)
        out = tl.dot(_dequant_v3(w, s, BN // 16, KC, x.dtype, SCALED), x, acc, input_precision=PREC)
    else:  # one exit: Triton would still compile the code after a return in a constexpr branch
        if EVEN_K:
            w = tl.load(w_ptrs + k0 // 2)
            s = tl.load(s_ptrs + k0 // 32)
        else:  # K tail: zero bytes decode to zeros (scale pads are zeros too, never NaN's 0xFF)
            g_ok = (k0 // 32 + g) < K // 32  # [BK/32]
            kw = tl.arange(0, BK // 2)
            w = tl.load(w_ptrs + k0 // 2, mask=((k0 + 2 * kw) < K)[None, :], other=0)
            s = tl.load(s_ptrs + k0 // 32, mask=g_ok[None, :], other=0)
        if SCALED:
            out = tl.dot_scaled(w, s, "e2m1", x, None, "bf16", acc=acc, fast_math=True)
        else:
            wd = _dequant(tl.reshape(w, (BN, BK // 32, 16)), s, BN, BK, x.dtype, False)
            out = tl.dot(wd, x, acc, input_precision=PREC)
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

"""The v3 layout's K step (moe_v3's GEMMs): a word's dequantization straight into a wgmma register
fragment (_dequant_v3, its PTX on CUDA), the weight and scale tile pointers (_v3_ptrs) and one K
step's dequant + dot, or tl.dot_scaled on the "v3ds" nibble layout (_v3_step)."""

from __future__ import annotations

import triton
import triton.language as tl

from gptoss.kernels.moe_v1 import _dequant

# A v3 word (v2's bits layout of bytes j = 2q + h: row g + 8h, K 2t + 8q + (0, 1)) and the bf16x2
# factors 2^(s-1) of rows g (f0) and g + 8 (f1) -> the 4 bf16x2 registers of one k16 MMA fragment:
# v2's 9 integer ops, then registers 0 and 2 (h = 0) times f0, 1 and 3 times f1. The multiplies
# stay here: scaling each 32-K group's MMA product in float32 instead (x times 2^64, one FFMA a group
# and accumulator register) cut batch 1's split-K K loop from 402 to 347 instructions and ran 7-21 %
# slower, each group's product waiting on the tensor core (bench/results v62).
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
        # (g, t, s): 16 bytes a lane. Built by broadcasting, not by reshaping an arange: Triton's
        # contiguity analysis keeps the last dim's 4 consecutive words only so: one 16-byte cp.async
        # a lane instead of four of 4 bytes (sm_90a, the BM-256 gate_up's K loop 176 -> 172 ins).
        lane = (tl.arange(0, 8) * 16)[:, None, None] + (tl.arange(0, 4) * 4)[None, :, None]
        lane = lane + tl.arange(0, 4)[None, None, :]
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
    WTMA: tl.constexpr = False,
):
    """acc [BN, BM] += W[:, k0:k0+BK] [BN, BK] @ x [BK, BM] (see _v3_ptrs for the pointers; g: their
    K-chunk index). SWZ: _dequant_v3 and tl.dot (SCALED: its PTX). Else tl.dot_scaled on bytes (low
    nibble first) and e8m0 scales if SCALED (CUDA), or the interpreter's stand-in: the same bytes
    dequantized by v1's portable path and a plain tl.dot. WTMA (SWZ only): w_ptrs and s_ptrs are
    tensor descriptors of the words [E*N/16, Kp/64, 128] and scale words [E*N/16, Kp/64, 8] (blocks
    [BN/16, BK/64, ...]) and g the tile's first 16-row block: one TMA copy each a K step, and the
    chunks past Kp arrive as zeros (which decode to zeros), so no mask."""
    if SWZ:
        KC: tl.constexpr = BK // 64
        if WTMA:
            w = tl.reshape(w_ptrs.load([g, k0 // 64, 0]), (BN // 16, KC, 8, 4, 4))
            s = tl.reshape(s_ptrs.load([g, k0 // 64, 0]), (BN // 16, KC, 8))
        elif EVEN_K:
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

"""The bits layout's K step, shared by the v2 GEMMs (moe_v2) and the decode GEMMs (moe_decode): a
word's dequantization to bf16 MMA registers (_dequant_bits, its PTX on CUDA), the weight, scale and
x tile pointers (_v2_ptrs) and one K step's dequant + dot (_v2_step; gate_up's two planes: _v2_pair_step)."""

from __future__ import annotations

import triton
import triton.language as tl

# v2 dequant on CUDA: a word in the v2 layout and the bf16x2 factor (2^(s-1), 2^(s-1)) -> its 4
# bf16x2 MMA registers (see _to_bits_layout): 9 integer ops and 4 multiplies for 8 values. The
# outputs are written last and the factor copied first, so any register sharing is harmless.
_BITS_TO_BF16_ASM: tl.constexpr = tl.constexpr("""
{
.reg .b32 a, b, c, d, e, f;
mov.b32 f, $5;
shl.b32 a, $4, 4; and.b32 a, a, 0x81C081C0; mul.rn.bf16x2 a, a, f;
shf.l.wrap.b32 b, $4, $4, 10; and.b32 b, b, 0x81C081C0; mul.rn.bf16x2 b, b, f;
shf.l.wrap.b32 c, $4, $4, 14; and.b32 c, c, 0x81C081C0; mul.rn.bf16x2 c, c, f;
shl.b32 d, $4, 8; and.b32 d, d, 0x01000100; and.b32 e, $4, 0x80C080C0; or.b32 d, d, e; mul.rn.bf16x2 d, d, f;
mov.b32 $0, a; mov.b32 $1, b; mov.b32 $2, c; mov.b32 $3, d;
}
""")


@triton.jit
def _dequant_bits(
    w,
    sw,
    S: tl.constexpr,
    BN: tl.constexpr,
    BKS: tl.constexpr,
    dtype: tl.constexpr,
    ASM: tl.constexpr,
    RAW: tl.constexpr = False,
):
    """w [S, BN, BKS/2] uint8 (v2 layout), sw [S, BN, BKS/128] int32 (4 scale bytes each) -> [S, BN, BKS].

    ASM (CUDA): _BITS_TO_BF16_ASM; LLVM folds the split into bf16 halves and the regrouping into
    no instructions (checked in the sm_90a SASS). Portable (the interpreter runs no PTX): the same
    registers by shifts, each bf16-placed value moved to fp16's bits (e2m1 * 2^-14, converted to
    float32 exactly) and scaled by 2^(s - 127 + 14) in float32.
    """
    G: tl.constexpr = BKS // 32
    sw = sw.to(tl.uint32, bitcast=True)
    s = tl.join(tl.join(sw & 0xFF, (sw >> 16) & 0xFF), tl.join((sw >> 8) & 0xFF, sw >> 24))
    s = tl.reshape(s, (S, BN, G))  # [S, BN, G] group g's scale byte (little endian)
    # The words arrive as bytes: a uint8 load is what makes Triton give each thread 8 consecutive K
    # (one word) of the MMA operand; LLVM folds the reassembly into the 4-byte load.
    b01, b23 = tl.split(tl.reshape(w, (S, BN, G, 4, 2, 2)))  # bytes (0, 2), (1, 3)
    b0, b2 = tl.split(b01)
    b1, b3 = tl.split(b23)
    w = (
        b0.to(tl.uint32) | (b1.to(tl.uint32) << 8) | (b2.to(tl.uint32) << 16) | (b3.to(tl.uint32) << 24)
    )  # [S, BN, G, 4]
    if RAW:  # timing probe (moe_v2_step PROBE 1): each word, xor its scale, as its 4 registers
        r0 = w ^ tl.broadcast_to(s.to(tl.uint32)[:, :, :, None], (S, BN, G, 4))
        r1, r2, r3 = r0, r0, r0
    elif ASM:
        f = tl.broadcast_to((s.to(tl.uint32) * 0x800080 + 0x3F003F00)[:, :, :, None], (S, BN, G, 4))
        r0, r1, r2, r3 = tl.inline_asm_elementwise(
            _BITS_TO_BF16_ASM,
            "=r,=r,=r,=r,r,r",
            [w, f],
            dtype=(tl.uint32, tl.uint32, tl.uint32, tl.uint32),
            is_pure=True,
            pack=1,
        )
    else:
        r0 = (w << 4) & 0x81C081C0
        r1 = ((w << 10) | (w >> 22)) & 0x81C081C0
        r2 = ((w << 14) | (w >> 18)) & 0x81C081C0
        r3 = (w & 0x80C080C0) | ((w << 8) & 0x01000100)
    q = tl.reshape(tl.join(tl.join(r0, r2), tl.join(r1, r3)), (S, BN, BKS // 2))  # word-major, register j
    if ASM or RAW:
        lo = (q & 0xFFFF).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        hi = (q >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        out = tl.reshape(tl.join(lo, hi), (S, BN, BKS)).to(dtype)
    else:
        v = tl.join(q & 0xFFFF, q >> 16)  # [S, BN, BKS/2, 2] bf16-placed bits
        v = ((v & 0x8000) | ((v & 0x01C0) << 3)).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
        scale = ((s.to(tl.int32) + 14) << 23).to(tl.float32, bitcast=True)  # [S, BN, G]
        v = tl.reshape(v, (S, BN, G, 32)) * scale[:, :, :, None]
        out = tl.reshape(v, (S, BN, BKS)).to(dtype)
    return out


@triton.jit
def _v2_ptrs(
    w_base,
    s_base,
    x_base,
    n_ld,
    row_off,
    stride_wn,
    stride_sn,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    SPLIT: tl.constexpr,
    XA: tl.constexpr,
):
    """Tile pointers at k0 = 0 and the K offsets of their masks. SPLIT 1: weight bytes [BN, BK/2],
    scale words [BN, BK/128], x [BK, BM] (XA: [BM, BK]); else each of the SPLIT warps owns a K slice
    of BK/SPLIT, first dim."""
    if SPLIT == 1:
        kw = tl.arange(0, BK // 2)[None, :]
        w = w_base + n_ld[:, None] * stride_wn + kw
        s = s_base + n_ld[:, None] * stride_sn + tl.arange(0, BK // 128)[None, :]
        if XA:
            kx = tl.arange(0, BK)[None, :]
            x = x_base + row_off[:, None] + kx
        else:
            kx = tl.arange(0, BK)[:, None]
            x = x_base + row_off[None, :] + kx
    else:
        BKS: tl.constexpr = BK // SPLIT
        sp = tl.arange(0, SPLIT)[:, None, None]
        kw = sp * (BKS // 2) + tl.arange(0, BKS // 2)[None, None, :]
        kx = sp * BKS + tl.arange(0, BKS)[None, :, None]
        w = w_base + n_ld[None, :, None] * stride_wn + kw
        s = (
            s_base
            + n_ld[None, :, None] * stride_sn
            + sp * (BKS // 128)
            + tl.arange(0, BKS // 128)[None, None, :]
        )
        x = x_base + row_off[None, None, :] + kx
    return w, s, x, kw, kx


@triton.jit
def _v2_step(
    acc,
    x,
    w_ptrs,
    s_ptrs,
    kw,
    k0,
    K: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    SPLIT: tl.constexpr,
    EVEN_K: tl.constexpr,
    PREC: tl.constexpr,
    ASM: tl.constexpr,
    XA: tl.constexpr,
    PROBE: tl.constexpr = 0,
):
    """acc += x @ dequant(W[:, k0:k0+BK])^T as the MMA wants it: acc [BN, BM] (SPLIT 1), [BM, BN] (XA:
    both wgmma operands in shared memory, so the MMA runs async under the next step's dequant) or
    [SPLIT, BN, BM].

    PROBE (timing only; the results are not the product): 1 loads the words as usual but feeds the
    dot their bits (no dequant arithmetic: the load path alone), 2 dequantizes a pattern made from the
    row and k0 instead of loading (no weight traffic: the compute path alone)."""
    if PROBE == 2:  # a pattern that differs by plane, row and step: no dequant shared or hoisted
        if SPLIT == 1:
            row = tl.arange(0, BN)[:, None]
        else:
            row = tl.arange(0, BN)[None, :, None]
        w = (w_ptrs.to(tl.int64) + row * 37 + kw + k0 // 2).to(tl.uint8)  # the plane's address too
        sw = (s_ptrs.to(tl.int64) + row * 3 + k0 // 128).to(tl.int32) & 0x7F7F7F7F
    else:
        w, sw = _v2_load(w_ptrs, s_ptrs, kw, k0, K, EVEN_K)
    if PROBE == 1:
        return _v2_mma(acc, x, w, sw, BN, BK, SPLIT, ASM, PREC, XA, True)
    return _v2_mma(acc, x, w, sw, BN, BK, SPLIT, ASM, PREC, XA)


@triton.jit
def _v2_pair_step(
    acc_g,
    acc_u,
    x,
    w_ptrs,
    s_ptrs,
    stride_wp,
    stride_sp,
    kw,
    k0,
    K: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    SPLIT: tl.constexpr,
    EVEN_K: tl.constexpr,
    PREC: tl.constexpr,
    ASM: tl.constexpr,
    XA: tl.constexpr,
    PROBE: tl.constexpr = 0,
):
    """gate_up's K step on one x tile: the gate plane at w_ptrs / s_ptrs, the up plane a plane stride on."""
    acc_g = _v2_step(acc_g, x, w_ptrs, s_ptrs, kw, k0, K, BN, BK, SPLIT, EVEN_K, PREC, ASM, XA, PROBE)
    acc_u = _v2_step(
        acc_u,
        x,
        w_ptrs + stride_wp,
        s_ptrs + stride_sp,
        kw,
        k0,
        K,
        BN,
        BK,
        SPLIT,
        EVEN_K,
        PREC,
        ASM,
        XA,
        PROBE,
    )
    return acc_g, acc_u


@triton.jit
def _v2_load(w_ptrs, s_ptrs, kw, k0, K: tl.constexpr, EVEN_K: tl.constexpr):
    """One K step's weight bytes and scale words (_v2_ptrs' tiles at k0)."""
    if EVEN_K:
        w = tl.load(w_ptrs + k0 // 2)
    else:  # K tail: zero words decode to zeros
        w = tl.load(w_ptrs + k0 // 2, mask=(k0 // 2 + kw) < K // 2, other=0)
    sw = tl.load(s_ptrs + k0 // 128)  # scale rows are padded to 16 bytes: never past a row
    return w, sw


@triton.jit
def _v2_mma(
    acc,
    x,
    w,
    sw,
    BN: tl.constexpr,
    BK: tl.constexpr,
    SPLIT: tl.constexpr,
    ASM: tl.constexpr,
    PREC: tl.constexpr,
    XA: tl.constexpr,
    RAW: tl.constexpr = False,
):
    """acc += x @ dequant(w, sw)^T (_v2_step's dot on loaded words; RAW: _dequant_bits' RAW)."""
    if SPLIT == 1:
        wd = tl.reshape(_dequant_bits(w[None, :, :], sw[None, :, :], 1, BN, BK, x.dtype, ASM, RAW), (BN, BK))
        if XA:
            out = tl.dot(x, tl.trans(wd), acc, input_precision=PREC)
        else:
            out = tl.dot(wd, x, acc, input_precision=PREC)
    else:
        wd = _dequant_bits(w, sw, SPLIT, BN, BK // SPLIT, x.dtype, ASM, RAW)
        out = tl.dot(wd, x, acc, input_precision=PREC)
    return out

"""The split-K decode K step with the e8m0 scales applied after the MMA (PSCALE), not on each weight.

moe_v3_step._dequant_v3 turns a v3 word into 4 bf16x2 registers with 9 integer ops and then 4
bf16x2 multiplies by 2^(s - 1): 4 of its 13 instructions a word (64 of a 402-instruction K step at
batch 1's gate_up, sm_90a). Here the words stay e2m1 * 2^-126 (the bits as placed, bf16 subnormals
for the code 0.5), each 32-K group gets its own mma.sync product, and that product is scaled in
float32: a multiply-add a group and accumulator register instead of a multiply a weight register.

The products must not be float32 subnormals: x is multiplied by 2^XS (exact in bf16 while |x| <
2^(128 - XS)), so a product is x * e2m1 * 2^(XS - 126), and a group's sum is scaled by 2^(s - 127 +
126 - XS) = 2^(s - 1 - XS), a float32 for every scale byte prepare_moe_weights lets through (s <=
MAX_SCALE_V2 = 128). The same sums as _v3_split_step's up to the order of the float32 additions.
"""

from __future__ import annotations

import triton
import triton.language as tl

XS = 64  # x's exponent shift: products of x * e2m1 >= 2^-XS stay normal float32
X_UP = tl.constexpr(2.0**XS)  # x times this (exact in bf16 while |x| < 2^(128 - XS))
EXP_BIAS = tl.constexpr((126 - XS) << 23)  # the factor's exponent field is the scale byte plus 126 - XS
# A scale word's 4 bytes -> their factors' float32 bits (_group_scales)
_FACTOR_ASM = tl.constexpr(f"""
{{
.reg .b32 a, b, c, d;
and.b32 a, $4, 0xFF; prmt.b32 b, $4, 0, 0x4441; prmt.b32 c, $4, 0, 0x4442; shr.u32 d, $4, 24;
mad.lo.u32 $0, a, 0x800000, {(126 - XS) << 23}; mad.lo.u32 $1, b, 0x800000, {(126 - XS) << 23};
mad.lo.u32 $2, c, 0x800000, {(126 - XS) << 23}; mad.lo.u32 $3, d, 0x800000, {(126 - XS) << 23};
}}
""")

# _V3_ASM's 9 integer ops without the multiplies: a word -> the 4 registers, e2m1 * 2^-126 each.
_RAW_ASM = tl.constexpr("""
{
.reg .b32 d, e;
shl.b32 $0, $4, 4; and.b32 $0, $0, 0x81C081C0;
shf.l.wrap.b32 $1, $4, $4, 10; and.b32 $1, $1, 0x81C081C0;
shf.l.wrap.b32 $2, $4, $4, 14; and.b32 $2, $2, 0x81C081C0;
shl.b32 d, $4, 8; and.b32 d, d, 0x01000100; and.b32 e, $4, 0x80C080C0; or.b32 $3, d, e;
}
""")


@triton.jit
def _dequant_raw(w, RB: tl.constexpr, KC: tl.constexpr, ASM: tl.constexpr):
    """w [RB, KC, 8, 4, 4] int32 (moe_v3_step._dequant_v3's words) -> [RB*16, KC*64] bf16 = e2m1 *
    2^-126, exactly, in _dequant_v3's order. Portable: the same registers by shifts, each value moved
    to fp16's bits (e2m1 * 2^-14), then times 2^-112 in float32 (the interpreter's bf16 holds it)."""
    w = tl.reshape(w.to(tl.uint32, bitcast=True), (RB, KC, 8, 4, 2, 2))  # [rb, kc, g, t, s2, s1]
    if ASM:
        r0, r1, r2, r3 = tl.inline_asm_elementwise(
            _RAW_ASM,
            "=r,=r,=r,=r,r",
            [w],
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
        v = tl.join(lo, hi)
    else:
        v = tl.join(q & 0xFFFF, q >> 16)
        v = ((v & 0x8000) | ((v & 0x01C0) << 3)).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
        v = (v * 1.925929944387236e-34).to(tl.bfloat16)  # 2^-112: e2m1 * 2^-126, a bf16 exactly
    v = tl.permute(v, (0, 6, 2, 1, 4, 5, 7, 3, 8))  # [rb, h, g, kc, s2, s1, q, t, nib]
    return tl.reshape(v, (RB * 16, KC * 64))


@triton.jit
def _group_scales(s, SPLIT: tl.constexpr, RB: tl.constexpr, KCS: tl.constexpr, ASM: tl.constexpr):
    """Scale words [SPLIT*RB, KCS, 8] (byte 2 s2 + h: row 16 rb + 8h + g, group 2 kc + s2) -> the
    float32 factors 2^(s - 1 - XS) [G*SPLIT, BN, 1], G = 2 KCS: batch g*SPLIT + split, row 16 rb + 8h + g.
    Each is the byte put in the exponent field plus 126 - XS (62..190): two ops (a byte's isolation,
    one multiply-add; ptxas made three of the plain shifts, masks and adds)."""
    s = tl.reshape(s.to(tl.uint32, bitcast=True), (SPLIT, RB, KCS, 8))
    if ASM:
        f0, f1, f2, f3 = tl.inline_asm_elementwise(
            _FACTOR_ASM,
            "=r,=r,=r,=r,r",
            [s],
            dtype=(tl.uint32, tl.uint32, tl.uint32, tl.uint32),
            is_pure=True,
            pack=1,
        )
    else:
        f0 = (s & 0xFF) * (1 << 23) + EXP_BIAS
        f1 = ((s >> 8) & 0xFF) * (1 << 23) + EXP_BIAS
        f2 = ((s >> 16) & 0xFF) * (1 << 23) + EXP_BIAS
        f3 = (s >> 24) * (1 << 23) + EXP_BIAS
    f = tl.join(tl.join(f0, f1), tl.join(f2, f3)).to(tl.float32, bitcast=True)  # [.., g, h, s2]
    f = tl.permute(f, (2, 5, 0, 1, 4, 3))  # [kc, s2, split, rb, h, g]
    return tl.reshape(f, (2 * KCS * SPLIT, RB * 16, 1))


@triton.jit
def _pscale_dot(
    acc,
    wd,
    x,
    s,
    BM: tl.constexpr,
    BN: tl.constexpr,
    SPLIT: tl.constexpr,
    KCS: tl.constexpr,
    ASM: tl.constexpr,
):
    """acc [SPLIT, BN, BM] += the scaled products of wd [SPLIT, BN, KCS*64] (e2m1 * 2^-126, K in
    _v3_split_step's order 16 j + 4t + 2q + nib, so 32-K group g is K 32g..32g+31) and x [SPLIT,
    KCS*64, BM] (times 2^XS, the same order), one mma.sync product a group (batch g*SPLIT + split:
    the split stays the batch's warp dim, the groups its repeats, so their sum is a thread's adds)."""
    G: tl.constexpr = 2 * KCS
    a = tl.reshape(tl.permute(tl.reshape(wd, (SPLIT, BN, G, 32)), (2, 0, 1, 3)), (G * SPLIT, BN, 32))
    b = tl.reshape(tl.permute(tl.reshape(x, (SPLIT, G, 32, BM)), (1, 0, 2, 3)), (G * SPLIT, 32, BM))
    part = tl.dot(a, b) * _group_scales(s, SPLIT, BN // 16, KCS, ASM)  # [G*SPLIT, BN, BM]
    return acc + tl.sum(tl.reshape(part, (G, SPLIT, BN, BM)), 0)

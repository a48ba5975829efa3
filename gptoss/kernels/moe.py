"""MXFP4 mixture of experts in Triton: routing, two grouped GEMMs (MXFP4 -> bf16 in-kernel), combine.

moe_forward(x [T, H]) = sum over the token's k experts of w_k * expert_k(x), as gptoss.model.MoE:

  logits = x @ router^T + b                        [T, E]   torch F.linear
  route_and_group                                  [T, k] ids/weights, per-expert row lists
  act = swiglu(x_rows @ W13_e^T + b13_e)           [A, I]   A = T*k rows, _gate_up_kernel
  y   = act @ W2_e^T + b2_e                        [A, H]   _down_kernel, in x.dtype
  out[t] = sum_j w[t, j] * y[t*k + j]  (float32)   [T, H]   _combine_kernel, deterministic

Both GEMMs tile every expert's rows into BM-row tiles; program (n, m) finds its expert and rows
from the per-expert counts (E ints, a cumsum in registers), so grids depend on T and the shapes
only and programs past the last tile exit: no host sync, capturable in a CUDA graph. Each
program computes acc^T [BN, BM] = W [BN, BK] @ x_rows^T [BK, BM]: the dequantized weights are
the register operand and the few token rows the narrow one, so decode (BM = 16) still feeds
the tensor cores; the weights stay packed in HBM and are read 16 bytes at a time along K.

Two kernel families, chosen by the weights' layout (prepare_moe_weights(kernels=...), default the
module's KERNELS): v1 (_gate_up_kernel, _down_kernel) reads the checkpoint's nibble order; v2
(_gate_up_v2_kernel, _down_v2_kernel, the default) reads the bits of every 4-byte word rearranged
at load (_to_bits_layout) so that a rotate and a mask put two e2m1 codes at their bf16 positions,
and one bf16x2 multiply by 2^(s - 1) finishes both: ~1.7 instructions a weight, against ~4 for
v1's nibble shuffles, which bound the decode kernels (an SM must dequantize ~23 values a cycle to
keep up with 3 TB/s). v2 also loads the scales as int32 words through the cp.async pipeline (v1's
byte loads are not pipelined: issued and waited for in the same K step) and, at decode, splits
each K step over 4 warps (a 3D dot, summed once at the end) for 4x the resident warps.
USE_ASM and TILE_OVERRIDE switch the rest at call time.

Work per forward, with d distinct experts hit (20b: H = I = 2880, E = 32, k = 4):
  gate_up  FLOPs 4*A*H*I; weight bytes d * (2I*H/2 + 2I*H/32) = d * 8.8 MB
  down     FLOPs 2*A*I*H; weight bytes d * (H*I/2 + H*I/32)   = d * 4.4 MB
  activations: x T*H, act A*I and y A*H (written, then read), out T*H, 2 bytes each.
Decode (T <= 16) is bound by the d * 13.2 MB of weights; large T by the FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from gptoss.kernels.moe_routing import Routing, route, route_and_group

__all__ = ["MoEWeights", "moe_forward", "moe_forward_from_logits", "prepare_moe_weights", "route"]


@dataclass(frozen=True, slots=True)
class MoEWeights:
    w13: Tensor  # [E, 2, I, H/2] uint8: [:, 0] gate rows, [:, 1] up rows; 8 e2m1 per 4 bytes (see layout)
    s13: Tensor  # [E, 2, I, >= H/32] uint8 e8m0 scales (rows padded to 16 bytes: aligned loads)
    b13: Tensor  # [E, 2, I] float32
    w2: Tensor  # [E, H, I/2] uint8
    s2: Tensor  # [E, H, >= I/32] uint8
    b2: Tensor  # [E, H] float32
    layout: str = "bits"  # "bits": w13/w2 bits rearranged for the v2 kernels; "nibble": checkpoint order (v1)

    @property
    def shape(self) -> tuple[int, int, int]:
        """(E, H, I)."""
        e, _, i, _ = self.w13.shape
        return e, self.w2.shape[1], i


def prepare_moe_weights(
    gate_up_blocks: Tensor,
    gate_up_scales: Tensor,
    gate_up_bias: Tensor,
    down_blocks: Tensor,
    down_scales: Tensor,
    down_bias: Tensor,
    kernels: str | None = None,
) -> MoEWeights:
    """Checkpoint tensors (gate/up rows interleaved) -> MoEWeights; runs once at load.

    The even (gate) and odd (up) rows of gate_up go to separate planes, so a program owning act
    columns [n, n+BN) reads both halves of its pairs with two plain tile loads, for any BN.
    kernels ("v1" | "v2", default the module's KERNELS) fixes the weight layout, hence the kernels
    moe_forward runs on these weights: v2 rearranges the bits of every 4-byte word (_to_bits_layout).
    """
    kernels = KERNELS if kernels is None else kernels
    if kernels not in ("v1", "v2"):
        raise ValueError(f"prepare_moe_weights: kernels must be 'v1' or 'v2', got {kernels!r}")
    e, n2, g, b = gate_up_blocks.shape
    h, i = g * 32, n2 // 2
    want = {
        "gate_up_blocks": (gate_up_blocks, (e, 2 * i, h // 32, 16), torch.uint8),
        "gate_up_scales": (gate_up_scales, (e, 2 * i, h // 32), torch.uint8),
        "gate_up_bias": (gate_up_bias, (e, 2 * i), None),
        "down_blocks": (down_blocks, (e, h, i // 32, 16), torch.uint8),
        "down_scales": (down_scales, (e, h, i // 32), torch.uint8),
        "down_bias": (down_bias, (e, h), None),
    }
    for name, (t, shape, dtype) in want.items():
        if tuple(t.shape) != shape or (dtype is not None and t.dtype != dtype):
            raise ValueError(
                f"prepare_moe_weights: {name} is {tuple(t.shape)} {t.dtype}, expected "
                f"{shape}{f' {dtype}' if dtype else ''} (E={e}, H={h}, I={i})"
            )
    if n2 % 2 or i % 32:
        raise ValueError(f"prepare_moe_weights: intermediate size {i} must be a multiple of 32")

    def planes(t: Tensor) -> Tensor:  # [E, 2I, ...] interleaved -> [E, 2, I, ...]
        return t.reshape(e, i, 2, -1).transpose(1, 2).contiguous()

    def padded(s: Tensor) -> Tensor:  # the kernels never read the pad
        return F.pad(s, (0, -s.shape[-1] % 16)).contiguous()

    w13 = planes(gate_up_blocks).view(e, 2, i, h // 2)
    w2 = down_blocks.reshape(e, h, i // 2).contiguous()
    if kernels == "v2":
        top = max(int(gate_up_scales.max()), int(down_scales.max()))  # once at load
        if top > MAX_SCALE_V2:
            raise ValueError(
                f"prepare_moe_weights: scale byte {top} > {MAX_SCALE_V2} (weights above 12): "
                "the v2 kernels' bf16 scale factor 2^(s-1) would overflow; use kernels='v1'"
            )
        w13, w2 = _to_bits_layout(w13), _to_bits_layout(w2)
    return MoEWeights(
        w13=w13,
        s13=padded(planes(gate_up_scales)),
        b13=planes(gate_up_bias.float()).view(e, 2, i),
        w2=w2,
        s2=padded(down_scales),
        b2=down_bias.float().contiguous(),
        layout="bits" if kernels == "v2" else "nibble",
    )


# The v2 layout. The kernels turn each 4-byte word (8 values of one row, in K order) into the 4
# bf16x2 registers the MMA takes, values (2j, 2j+1) in register j, each value as e2m1 * 2^-126:
# sign at bit 15, the magnitude bits e1 e0 m at bits 8:6 (bf16's low exponent bits and top mantissa
# bit; the code 0.5 lands on the subnormal 2^-127), +16 for the odd value; one bf16x2 multiply by
# 2^(s - 1) then makes them exact. No 4 rotations of one word can place all 32 bits (checked by
# exhaustive search), so registers 0-2 take a rotation and a mask (2 SASS ops) and register 3 the
# bits already in place plus two shifted by 8 (3 ops): 9 ops for 8 values (v1: 18 + 4 regroupings).
_E2M1_TO_BF16_BIT = (6, 7, 8, 15)  # e2m1 bit i (m, e0, e1, sign) -> bf16 bit; the odd value +16
_ROTATE = (4, 10, 14)  # register j < 3 = rotl(word, _ROTATE[j]) & 0x81C081C0
_BIT_FROM = tuple({t: (t - r) % 32 for t in range(32)} for r in _ROTATE) + (
    {t: t - 8 if t in (8, 24) else t for t in range(32)},
)  # register 3: (w & 0x80C080C0) | ((w << 8) & 0x01000100)
MAX_SCALE_V2 = 128  # v2 multiplies by the bf16 2^(s - 1); 2^127 is bf16's largest power of 2


def _to_bits_layout(blocks: Tensor) -> Tensor:
    """[E, ..., K/2] uint8 in checkpoint order (byte b: value 2b low nibble, 2b+1 high) -> the v2 layout.

    One expert at a time, so the temporaries stay at an expert's size (120b: 1/128 of a layer)."""
    out = torch.empty_like(blocks)
    for e in range(blocks.shape[0]):
        words = blocks[e].contiguous().view(torch.int32)  # [..., K/8]; little endian: byte j = bits 8j..8j+7
        acc = torch.zeros_like(words)
        for j, bit_from in enumerate(_BIT_FROM):  # register j <- byte j
            for half in (0, 1):  # the low nibble (value 2j) -> bits 15:0, the high one -> 31:16
                for i, t in enumerate(_E2M1_TO_BF16_BIT):
                    acc |= ((words >> (8 * j + 4 * half + i)) & 1) << bit_from[t + 16 * half]
        out[e] = acc.view(torch.uint8).view(blocks.shape[1:])
    return out


@dataclass(frozen=True, slots=True)
class Tiles:
    bm: int  # token rows per tile (the narrow dot operand)
    bn: int  # output columns per program (gate_up: act columns, i.e. weight-row pairs)
    bk: int  # K per step; a multiple of 32 (one scale per 32)
    warps: int
    stages: int
    split: int = 1  # v2 only: warps splitting each BK step along K (a batched MMA, summed at the end)
    xa: bool = False  # v2, split 1: x is the MMA's A operand, the dequantized weights B (through smem)


# By BM, the token rows an expert gets if routing is even (16..128). Each warp owns distinct weight
# rows (BN = 16 * warps for mma.sync, 64 rows a warpgroup for wgmma), so no weight is dequantized
# twice; checked in the sm_90a SASS, as are registers (<= 230, no spills) at the 20b shapes.
# Decode (BM 16) streams the weights: 90 N-tiles an expert, 2-warp programs, 256 K (128 B a row)
# a step, 4 stages in flight. Past BM 32 the GEMMs are compute-bound: wgmma tiles.
_GATE_UP_TILES = {
    16: Tiles(16, 32, 256, 2, 4),
    32: Tiles(32, 64, 128, 4, 3),
    64: Tiles(64, 64, 128, 4, 3),
    128: Tiles(64, 128, 64, 8, 3),
}
_DOWN_TILES = {
    16: Tiles(16, 32, 256, 2, 4),
    32: Tiles(32, 64, 128, 4, 3),
    64: Tiles(64, 128, 64, 8, 3),
    128: Tiles(128, 128, 64, 8, 3),
}


def choose_tiles(t: int, top_k: int, e: int, n: int, k: int, gate_up: bool) -> Tiles:
    """Block sizes from the shapes, no autotuning. n: output columns (gate_up: I), k: the K dim."""
    rows = triton.cdiv(t * top_k, e)  # rows an expert gets if routing is even
    cfg = (_GATE_UP_TILES if gate_up else _DOWN_TILES)[min(128, max(16, triton.next_power_of_2(rows)))]
    bn = min(cfg.bn, max(16, triton.next_power_of_2(n)))
    bk = min(cfg.bk, 1 << (k.bit_length() - 1))  # <= K; K % BK != 0 takes the masked path
    return Tiles(cfg.bm, bn, bk, min(cfg.warps, bn // 16), cfg.stages)


# v2 (weights in the bits layout), by BM as above. Decode and BM 32 split each 512-K step over 4
# warps, one 128-K slice a warp, every warp on all BN rows (no weight dequantized twice, 4x the
# resident warps of one warp per 16 rows: 1440 warps over the 4 experts' gate/up rows at T = 1).
# A slice is >= 128 K so its scales are whole int32 words (cp.async needs >= 4 bytes a thread).
# Past BM 32, wgmma tiles with BK 128. In the sm_90a SASS (20b shapes, bf16): 3.3 instructions a
# weight value at decode (v1: 4.9), of which 1.66 dequant, 0.25 HMMA and ~0.45 moves of the x
# operand between its LDS.128 and the HMMA register pairs; BM 128 gate_up 5.6 a value for 128 rows
# (v1 at T 4096: 6.0 for 64 rows). Registers <= 255, spills only outside the K loop.
# Buckets 32 and 64 (M 128-512 at 20b, Offline decode) take 32-row xa tiles: measured on the H100
# (bench/results 2026-11-22 v5) M 256 645 -> 438 us, M 512 753 -> 672 us; xa at BM 64/128 was slower.
_XA32 = Tiles(32, 64, 128, 4, 3, xa=True)
_GATE_UP_TILES_V2 = {
    16: Tiles(16, 32, 512, 4, 3, 4),
    32: _XA32,
    64: _XA32,
    128: Tiles(128, 128, 128, 8, 3),
}
_DOWN_TILES_V2 = {
    16: Tiles(16, 32, 512, 4, 3, 4),
    32: _XA32,
    64: _XA32,
    128: Tiles(128, 128, 128, 8, 3),
}
TILE_OVERRIDE: dict[tuple[int, bool], Tiles] = {}  # (BM bucket, gate_up) -> v2 tiles; for benchmarks


def choose_tiles_v2(t: int, top_k: int, e: int, n: int, k: int, gate_up: bool) -> Tiles:
    """choose_tiles for the v2 kernels: BK/split >= 128 (whole scale words) and BK <= 512 (scale pad)."""
    rows = triton.cdiv(t * top_k, e)
    bucket = min(128, max(16, triton.next_power_of_2(rows)))
    cfg = TILE_OVERRIDE.get((bucket, gate_up)) or (_GATE_UP_TILES_V2 if gate_up else _DOWN_TILES_V2)[bucket]
    bn = min(cfg.bn, max(16, triton.next_power_of_2(n)))
    split = cfg.split
    bk = max(128 * split, min(cfg.bk, triton.next_power_of_2(k)))  # past K: the masked tail
    warps = cfg.warps if split > 1 else min(cfg.warps, bn // 16)
    return Tiles(cfg.bm, bn, bk, warps, cfg.stages, split, cfg.xa)


@triton.jit
def _expert_tile(counts_ptr, rows_ptr, T, pid_m, E: tl.constexpr, BE: tl.constexpr, BM: tl.constexpr):
    """Tile pid_m -> (expert, its assignment rows [BM], valid [BM], tiles in all)."""
    ex = tl.arange(0, BE)
    cnt = tl.load(counts_ptr + ex, mask=ex < E, other=0)  # [BE]
    tiles = (cnt + BM - 1) // BM
    ends = tl.cumsum(tiles, 0)  # [BE] inclusive
    e = tl.sum((ends <= pid_m).to(tl.int32), 0)  # E when pid_m is past the last tile
    first = tl.sum(tl.where(ex == e, ends - tiles, 0), 0)
    n_rows = tl.sum(tl.where(ex == e, cnt, 0), 0)
    slot = (pid_m - first) * BM + tl.arange(0, BM)
    valid = slot < n_rows
    rows = tl.load(rows_ptr + e * T + slot, mask=valid, other=0)  # invalid -> row 0, never stored
    return e, rows, valid, tl.sum(tiles, 0)


@triton.jit
def _lora_expand(acc, b_ptr, s_ptr, rows, valid, n_ld, LW: tl.constexpr, PREC: tl.constexpr):
    """acc [BN, BM] + B[n_ld] [BN, LW] @ s[rows]^T [LW, BM]: a LoRA delta added before the epilogue.

    b_ptr: one expert's B [N, LW] (plane), s_ptr: the shrunk rows [A, LW], both in the input dtype."""
    w = tl.arange(0, LW)
    b = tl.load(b_ptr + n_ld[:, None] * LW + w[None, :])  # [BN, LW]
    st = tl.load(s_ptr + rows.to(tl.int64)[None, :] * LW + w[:, None], mask=valid[None, :], other=0.0)
    return tl.dot(b, st, acc, input_precision=PREC)


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
    w, sw, S: tl.constexpr, BN: tl.constexpr, BKS: tl.constexpr, dtype: tl.constexpr, ASM: tl.constexpr
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
    if ASM:
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
    if ASM:
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
):
    """acc += x @ dequant(W[:, k0:k0+BK])^T as the MMA wants it: acc [BN, BM] (SPLIT 1), [BM, BN] (XA:
    both wgmma operands in shared memory, so the MMA runs async under the next step's dequant) or
    [SPLIT, BN, BM]."""
    if EVEN_K:
        w = tl.load(w_ptrs + k0 // 2)
    else:  # K tail: zero words decode to zeros
        w = tl.load(w_ptrs + k0 // 2, mask=(k0 // 2 + kw) < K // 2, other=0)
    sw = tl.load(s_ptrs + k0 // 128)  # scale rows are padded to 16 bytes: never past a row
    if SPLIT == 1:
        wd = tl.reshape(_dequant_bits(w[None, :, :], sw[None, :, :], 1, BN, BK, x.dtype, ASM), (BN, BK))
        if XA:
            out = tl.dot(x, tl.trans(wd), acc, input_precision=PREC)
        else:
            out = tl.dot(wd, x, acc, input_precision=PREC)
    else:
        wd = _dequant_bits(w, sw, SPLIT, BN, BK // SPLIT, x.dtype, ASM)
        out = tl.dot(wd, x, acc, input_precision=PREC)
    return out


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
        acc_g = _v2_step(acc_g, xt, w_g, s_g, kw, k0, K, BN, BK, SPLIT, EVEN_K, PREC, ASM, XA)
        acc_u = _v2_step(
            acc_u, xt, w_g + stride_wp, s_g + stride_sp, kw, k0, K, BN, BK, SPLIT, EVEN_K, PREC, ASM, XA
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


@triton.jit
def _combine_kernel(y_ptr, w_ptr, out_ptr, H, TOP_K: tl.constexpr, BH: tl.constexpr):
    """out[t] = sum_j w[t, j] * y[t*k + j] in float32, in slot order (no atomics: deterministic)."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BH + tl.arange(0, BH)
    h_ok = h < H
    acc = tl.zeros([BH], tl.float32)
    for j in tl.static_range(TOP_K):
        wj = tl.load(w_ptr + t * TOP_K + j)
        acc += wj * tl.load(y_ptr + (t * TOP_K + j) * H + h, mask=h_ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * H + h, acc.to(out_ptr.dtype.element_ty), mask=h_ok)


def _empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    return torch.empty(shape, dtype=dtype, device=device)  # tests swap this for NaN-filled buffers


def _grid(t: int, top_k: int, e: int, n: int, tiles: Tiles) -> tuple[int, int]:
    a = t * top_k
    # Each expert's rows fill whole tiles but its last: at most (A + min(E, A)*(BM-1)) / BM tiles.
    max_tiles = min(a, (a + min(e, a) * (tiles.bm - 1)) // tiles.bm)
    return triton.cdiv(n, tiles.bn), max_tiles


def _lora_args(lora: tuple[Tensor, Tensor] | None, x: Tensor, planes: bool) -> tuple[list, dict]:
    """The kernels' LoRA arguments: (B planes [E, 2, N, W] or B [E, N, W], s [A, W]); x stands in for
    the pointers when there is no LoRA (LORA=False compiles them out)."""
    if lora is None:
        return [x, x, 0] + ([0] if planes else []), {"LORA": False, "LW": 16}
    b, sh = lora
    return [b, sh, b.stride(0)] + ([b.stride(1)] if planes else []), {"LORA": True, "LW": b.shape[-1]}


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
    act = _empty((t * k, i), x.dtype, x.device)
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
        ASM=_use_asm(x),
        **lkw,
        num_warps=tiles.warps,
        num_stages=tiles.stages,
    )
    return act


def down(
    act: Tensor, r: Routing, w: MoEWeights, tiles: Tiles, lora: tuple[Tensor, Tensor] | None = None
) -> Tensor:
    """act [T*k, I] -> y [T*k, H] in act.dtype, bias added, not yet weighted. lora: (B [E, H, W], the
    rows' shrunk act [T*k, W]) adds their LoRA delta."""
    a, i = act.shape
    e, h, _ = w.shape
    t = r.ids.shape[0]
    y = _empty((a, h), act.dtype, act.device)
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
        ASM=_use_asm(act),
        **lkw,
        num_warps=tiles.warps,
        num_stages=tiles.stages,
    )
    return y


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
    act = _empty((t * k, i), x.dtype, x.device)
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
        ASM=_use_asm(x),
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
    y = _empty((a, h), act.dtype, act.device)
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
        ASM=_use_asm(act),
        XA=tiles.xa,
        **lkw,
        num_warps=tiles.warps,
        num_stages=tiles.stages,
    )
    return y


def combine(y: Tensor, weights: Tensor, dtype: torch.dtype) -> Tensor:
    """y [T*k, H], weights [T, k] -> [T, H] in dtype."""
    t, k = weights.shape
    h = y.shape[1]
    out = _empty((t, h), dtype, y.device)
    bh = min(1024, triton.next_power_of_2(h))
    _combine_kernel[(t, triton.cdiv(h, bh))](y, weights, out, h, TOP_K=k, BH=bh, num_warps=4)
    return out


# Switches, read at call time, so one process can A/B the paths:
KERNELS = "v2"  # the kernels (hence weight layout) prepare_moe_weights picks by default: "v1" | "v2"
USE_ASM = True  # the PTX dequant on CUDA (both paths); False falls back to the portable one everywhere


def _use_asm(x: Tensor) -> bool:
    return USE_ASM and x.is_cuda and not triton.knobs.runtime.interpret


def _precision(x: Tensor) -> str:
    return "ieee" if x.dtype == torch.float32 else "tf32"  # float32 inputs: no TF32 rounding


def moe_forward(
    x: Tensor,
    router_weight: Tensor,
    router_bias: Tensor,
    top_k: int,
    w: MoEWeights,
    alpha: float,
    limit: float,
) -> Tensor:
    """x [T, H] -> [T, H] in x.dtype; gptoss.model.MoE.forward on the GPU kernels."""
    e, h, i = w.shape
    if x.dim() != 2 or x.shape[1] != h or router_weight.shape != (e, h):
        raise ValueError(
            f"moe_forward: x {tuple(x.shape)}, router {tuple(router_weight.shape)} do not "
            f"match the experts (E={e}, H={h}, I={i})"
        )
    logits = F.linear(x, router_weight, router_bias)  # [T, E]
    return moe_forward_from_logits(x, logits, top_k, w, alpha, limit)


def moe_forward_from_logits(
    x: Tensor, logits: Tensor, top_k: int, w: MoEWeights, alpha: float, limit: float
) -> Tensor:
    """x [T, H], router logits [T, E] -> [T, H]: moe_forward after its router (vLLM's plugin enters here)."""
    e, h, i = w.shape
    if x.dim() != 2 or x.shape[1] != h or logits.shape != (x.shape[0], e):
        raise ValueError(
            f"moe_forward: x {tuple(x.shape)}, logits {tuple(logits.shape)} do not match the "
            f"experts (E={e}, H={h}, I={i})"
        )
    if not (x.is_cuda or triton.knobs.runtime.interpret):
        raise RuntimeError(
            "moe_forward runs Triton kernels: it needs CUDA tensors (or TRITON_INTERPRET=1); "
            "on CPU use gptoss.model.MoE"
        )
    x = x.contiguous()
    t = x.shape[0]
    if t == 0:
        return torch.empty_like(x)
    r = route_and_group(logits, top_k)
    if w.layout == "bits":
        act = gate_up_v2(x, r, w, alpha, limit, choose_tiles_v2(t, top_k, e, i, h, gate_up=True))  # [T*k, I]
        y = down_v2(act, r, w, choose_tiles_v2(t, top_k, e, h, i, gate_up=False))  # [T*k, H]
    else:
        act = gate_up(x, r, w, alpha, limit, choose_tiles(t, top_k, e, i, h, gate_up=True))
        y = down(act, r, w, choose_tiles(t, top_k, e, h, i, gate_up=False))
    return combine(y, r.weights, x.dtype)

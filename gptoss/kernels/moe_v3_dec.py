"""The v3 layout's down GEMM at decode batch sizes: a split-K expert-slot kernel, as moe_decode's
_down_dec_kernel on the bits layout, reading the "v3" lane-fragment words (moe_layout._to_v3_layout).

down_v3_dec(act, r, w) = moe_v3.down_v3(act, r, w, tiles) for T <= moe_tiles.DECODE_MAX_T (no LoRA,
act in assignment order): y [T*k, H] = act @ W2_e^T + b2_e row by row.

Why. At batch 1 on an H100 (120b shapes) the v3 down on its decode tiles (Tiles(16, 64, 128, 4, 4):
64 weight rows, one warpgroup, BK 128) takes 16.8 us a layer, the v2 decode down 10.7 us for the
same bytes: that one has twice the programs (BN 32) and splits each 512-K step over 4 warps (a
batched dot [SPLIT, BN, BM], summed once after the loop), so 4 warps dequantize at once and each
program keeps 4x the bytes in flight. This kernel does the same on v3 words: warp s of a step owns
whole 64-K chunks s*KCS .. s*KCS + KCS - 1 (KCS = BK / SPLIT / 64) of all BN rows, so no weight is
dequantized twice. The batched dot is mma.sync (wgmma takes no batch dim), whose A fragment is the
layout's lane fragment up to the order of K within a lane (Triton gives 16-bit operands 4 consecutive
K a lane): both operands are reordered alike (_v3_split_step), so moe_v3_step._dequant_v3's
registers feed the MMA as they stand, the split folded into its row-block dim. The rows are padded
to whole 64-K chunks (zeros), so a K tail (I = 2880 = 45 x 64 against BK 512) masks whole chunks.

sm_90a SASS (compiled on CPU as bench/kernels/moe_decode_sass.py does; 120b's down, bf16, PDL), K
loop instructions a weight value, registers, shared memory, no spills: BM 1 2.88, 101, 19 KB;
BM 8 3.06, 126, 33 KB; BM 16 3.82, 168, 49 KB (the v2 decode down: BM 1 2.86, BM 8 3.04; the v3
down's decode tiles: 4.11).

Measured (H100, random 120b, bench/results v24): at batch 1 the down takes 12.6 us a layer (16.8 on
v3's decode tiles) and the engine 298.2 / 298.1 tok/s against 285.2 / 283.6 (+4.6-5.1 %); the whole
decode MoE in a CUDA graph at M 1 56.5 against 59.4 us. From M 2 it is slower (M 2 / 4 / 8 / 16:
87.0 / 123.6 / 179.4 / 294.3 against 83.7 / 115.3 / 169.3 / 245.1 us: its 32-row programs at BM 2-16
stream less than the warpgroup tiles). That was on cp.async; with its weights by TMA (WTMA) on an
H200 the engine gains at 2 and 5-7 tokens, and at 8-16 on tiles of their own (V3_DOWN_DEC_BIG;
moe_v3_dec_sizes.SPLIT_K_TOKENS says by how much), so moe.expert_rows_v3
takes it for decode batches of TOKENS tokens (default SPLIT_K_TOKENS; GPTOSS_V3_DEC_DOWN) on "v3"
weights whose act rows are in assignment order. Its sums run in another order than v3's tiles, so a
batch of one token and a larger one differ in the last bits, as the decode kernels on the bits
layout already do (the batch-invariant mode runs neither).
"""

from __future__ import annotations

import os

import triton
import triton.language as tl
from torch import Tensor

from gptoss.kernels import moe_common as common
from gptoss.kernels import pdl
from gptoss.kernels.moe_common import _precision, _slot_expert
from gptoss.kernels.moe_layout import MoEWeights
from gptoss.kernels.moe_routing import Routing
from gptoss.kernels.moe_tiles import DecTiles
from gptoss.kernels.moe_v3 import _check, _scaled, _tma_runs, _weight_args, weight_descriptors
from gptoss.kernels.moe_v3_dec_sizes import (
    batch_tiles,
    env_dec_tiles,
    env_tokens,
    fit_dec_tiles,
    split_copies_fit,
)
from gptoss.kernels.moe_v3_step import _dequant_v3


def _tokens(v: str | None) -> frozenset[int]:
    return env_tokens(v, "GPTOSS_V3_DEC_DOWN", "down")


TOKENS = _tokens(os.environ.get("GPTOSS_V3_DEC_DOWN"))
# GPTOSS_V3_DEC_WTMA (default on; 0 turns it off): this kernel's weight and scale words by TMA too
# (one copy a K step, the same bits), as moe_v3's GEMMs take them (GPTOSS_MOE_V3_WTMA), and those of
# moe_v3_dec_gu's split-K gate_up where GPTOSS_V3_DEC_GATE_UP takes it (untimed there). H200, random
# 120b, batch-1 128 -> 512, one process each, interleaved (bench/results v30): 350.7 / 341.5 / 347.3
# tok/s against 337.0 / 337.3 / 334.7 off (+3.0 % on the means); the down 11.9 -> 9.8 us a layer
# in the profile (PDL off).
WTMA = os.environ.get("GPTOSS_V3_DEC_WTMA", "1") != "0"
# The v2 decode down's tiles (moe_tiles.DOWN_DEC_TILES) with BM up to 16 (the x tile; T's power of
# 2 at launch): 32 weight rows, a 512-K step split over 4 warps of 128 K (2 chunks each), 3 stages.
# GPTOSS_V3_DEC_DOWN_TILES overrides them.
V3_DOWN_DEC = env_dec_tiles(
    "GPTOSS_V3_DEC_DOWN_TILES", DecTiles(bm=16, bn=32, bk=512, split=4, warps=4, stages=3)
)
# Batches of 8-16 tokens (moe_v3_dec_sizes.BIG_FROM..), and of 3-4 (BIG_ALSO, v62), on tiles of their own: an
# x tile of 8 rows (4 at 3-4 tokens, fitted) and 64 weight rows a program. At 16 tokens 20b's experts get 2
# rows on average (64 choices over 32), so BM 16 mostly multiplied zero rows (K loop 3.82 instructions a value
# against 3.06 at BM 8, sm_90a); an expert's rows past 8 loop over the same, L2-warm, weights. H200, the whole
# decode MoE in a CUDA graph, these tiles for both split-K GEMMs against the BM-16 defaults and the engine's
# v2 slot kernels (bench/results v59, `moe_gpu.py --ms 12,16`), us: 20b M 12 123.2 against 177.8 and 158.5, M
# 16 143.2 against 204.0 and 218.9; 120b M 12 192.9 / 288.2 / 261.1, M 16 193.8 / 288.9 / 261.4. Under a
# register cap of 128 (v60; 163 -> 128 registers, 3 -> 4 programs an SM, 6 spills outside the K loop; the
# gate_up's 110 -> 95, 4 -> 5) the whole MoE is 1-4 % faster at 9-16 tokens and, at 120b, 6 % at 8; in the
# engine (bench/decode_ab_gpu.py, 128 -> 512, best tok/s) 20b batch 12 2,822.3 -> 2,845.7, 16 3,501.4 ->
# 3,534.8, 8 2,058.5 -> 2,052.8 (-0.3 %, on these tiles from 8); 120b batch 8 1,070.7 -> 1,104.1, 12 1,328.2
# -> 1,365.0, 16 1,478.4 -> 1,510.5. Below 8 tokens they did not help alone in a graph (v59: M 1 43.6 against
# 38.3, M 2-7 within +-2 %); in the engine they do at 3-4 (v62, moe_v3_dec_sizes.SPLIT_K_TOKENS' comment),
# where the small tiles' BM 4 lost. GPTOSS_V3_DEC_DOWN_TILES_BIG overrides them.
V3_DOWN_DEC_BIG = env_dec_tiles(
    "GPTOSS_V3_DEC_DOWN_TILES_BIG", DecTiles(bm=8, bn=64, bk=512, split=4, warps=4, stages=3, maxnreg=128)
)


@triton.jit
def _v3_split_ptrs(
    w_ptr,
    s_ptr,
    e,
    n0,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    N: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    SPLIT: tl.constexpr,
):
    """moe_v3_step._v3_ptrs (SWZ) with a leading split dim, for expert e's rows n0..: words
    [SPLIT, BN/16, KCS, 8, 4, 4] and scale words [SPLIT, BN/16, KCS, 8] at k0 = 0, and each chunk's
    index in the step [SPLIT, KCS]."""
    e64 = e.to(tl.int64)
    w_base, s_base = w_ptr + e64 * stride_we, s_ptr + e64 * stride_se
    RB: tl.constexpr = BN // 16
    KCS: tl.constexpr = BK // SPLIT // 64
    tl.static_assert(BK % (64 * SPLIT) == 0 and BN % 16 == 0, "v3 words come in 16-row x 64-K blocks")
    rb = (n0 // 16 + tl.arange(0, RB)) % (N // 16)  # past-the-end blocks reload valid rows
    c = tl.arange(0, SPLIT)[:, None] * KCS + tl.arange(0, KCS)[None, :]  # warp s: chunks s*KCS..
    # (g, t, s) by broadcasting, as _v3_ptrs: one 16-byte cp.async a lane
    lane = (tl.arange(0, 8) * 16)[:, None, None] + (tl.arange(0, 4) * 4)[None, :, None]
    lane = lane + tl.arange(0, 4)[None, None, :]
    w = w_base + rb[None, :, None, None, None, None] * stride_wn + c[:, None, :, None, None, None] * 128
    w = w + lane[None, None, None, :, :, :]
    s = s_base + rb[None, :, None, None] * stride_sn + c[:, None, :, None] * 8
    s = s + tl.arange(0, 8)[None, None, None, :]
    return w, s, c


@triton.jit
def _v3_split_step(
    acc,
    x,
    w_ptrs,
    s_ptrs,
    c,
    k0,
    K: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    SPLIT: tl.constexpr,
    EVEN_K: tl.constexpr,
    ASM: tl.constexpr,
    PREC: tl.constexpr,
    WTMA: tl.constexpr = False,
):
    """acc [SPLIT, BN, BM] += W [SPLIT, BN, BK/SPLIT] @ x [SPLIT, BK/SPLIT, BM], warp s's K slice
    k0 + s*BK/SPLIT.. (c: the pointers' chunk indices in a step). WTMA: w_ptrs and s_ptrs are
    moe_v3.weight_descriptors' (blocks [BN/16, BK/64, ...]) and c the tile's first 16-row block: the
    step's chunks in one copy each, chunk j of the step warp j // KCS's (zero fill past K)."""
    RB: tl.constexpr = BN // 16
    KCS: tl.constexpr = BK // SPLIT // 64
    if WTMA:
        w = tl.permute(
            tl.reshape(w_ptrs.load([c, k0 // 64, 0]), (RB, SPLIT, KCS, 8, 4, 4)), (1, 0, 2, 3, 4, 5)
        )
        s = tl.permute(tl.reshape(s_ptrs.load([c, k0 // 64, 0]), (RB, SPLIT, KCS, 8)), (1, 0, 2, 3))
    elif EVEN_K:
        w = tl.load(w_ptrs + (k0 // 64) * 128)
        s = tl.load(s_ptrs + (k0 // 64) * 8)
    else:  # past the padded K: whole 64-K chunks, masked (zero words decode to zeros)
        c_ok = (k0 // 64 + c) < (K + 63) // 64  # [SPLIT, KCS]
        w = tl.load(w_ptrs + (k0 // 64) * 128, mask=c_ok[:, None, :, None, None, None], other=0)
        s = tl.load(s_ptrs + (k0 // 64) * 8, mask=c_ok[:, None, :, None], other=0)
    # The split folded into the row blocks: row 16 (s RB + rb) + r of the result is warp s's row 16 rb + r.
    w = tl.reshape(w, (SPLIT * RB, KCS, 8, 4, 4))
    s = tl.reshape(s, (SPLIT * RB, KCS, 8))
    wd = _dequant_v3(w, s, SPLIT * RB, KCS, x.dtype, ASM)  # K 16 j + 8q + 2t + nib: lane t, reg 2q + h
    # Both operands in K order 16 j + 4t + 2q + nib (the same sum). Triton gives mma.sync's 16-bit
    # operands 4 consecutive K a lane (kWidth 4), so in this order the dequantized registers are the
    # A fragment as they stand and x's reorder is ldmatrix addressing (sm_90a TTGIR); in _dequant_v3's
    # order A went through shared memory: 716 instructions in the K loop at BM 1 against 368.
    wd = tl.permute(tl.reshape(wd, (SPLIT, BN, KCS * 4, 2, 4, 2)), (0, 1, 2, 4, 3, 5))
    x = tl.permute(tl.reshape(x, (SPLIT, KCS * 4, 2, 4, 2, BM)), (0, 1, 3, 2, 4, 5))
    return tl.dot(
        tl.reshape(wd, (SPLIT, BN, KCS * 64)), tl.reshape(x, (SPLIT, KCS * 64, BM)), acc, input_precision=PREC
    )


@triton.jit(do_not_specialize=["T"])  # T changes every step: no recompiles on its value
def _down_v3_dec_kernel(
    a_ptr,
    w_ptr,
    s_ptr,
    b_ptr,
    y_ptr,
    counts_ptr,
    rows_ptr,
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
    ASM: tl.constexpr,
    PREC: tl.constexpr,
    PDL: tl.constexpr,
    w_desc=None,
    s_desc=None,
    WTMA: tl.constexpr = False,
    ids_ptr=None,
    ONE_TOKEN: tl.constexpr = False,
    UNMASKED: tl.constexpr = False,
):
    """Program (column block, slot): y[rows of the slot's expert, block] = act[rows] @ W2_e^T + b2_e;
    N = H, K = I; act and y rows in assignment order (rows_ptr: each expert's list). ONE_TOKEN (T 1,
    batch 1's step): slot s is assignment s, act and y row s of expert ids[0, s] (its k experts are
    distinct), read from the routing's ids: one load after the wait, where the counts, the slot's
    expert among them and its row list were a chain of two."""
    pdl.wait_then_release(PDL)
    pid_n, s = tl.program_id(0), tl.program_id(1)
    if ONE_TOKEN:
        e = tl.load(ids_ptr + s)
        n_rows = 1
    else:
        ex = tl.arange(0, BE)
        e, n_rows, _ = _slot_expert(tl.load(counts_ptr + ex, mask=ex < E, other=0), ex, s)
        if n_rows == 0:  # past the active experts
            return
    EVEN_K: tl.constexpr = (K + 63) // 64 * 64 % BK == 0  # the rows are padded to 64
    BKS: tl.constexpr = BK // SPLIT
    n = pid_n * BN + tl.arange(0, BN)
    e64 = e.to(tl.int64)
    if WTMA:  # the tile's first 16-row block in the [E * N/16, ...] descriptors
        w_t, s_t, c = w_desc, s_desc, e * (N // 16) + pid_n * (BN // 16)
    else:
        args = (w_ptr, s_ptr, e, pid_n * BN, stride_we, stride_wn, stride_se, stride_sn)
        w_t, s_t, c = _v3_split_ptrs(*args, N, BN, BK, SPLIT)
    bias = tl.load(b_ptr + e64 * N + n % N)[:, None]  # [BN, 1]; past-the-end columns never stored
    kx = tl.arange(0, SPLIT)[:, None, None] * BKS + tl.arange(0, BKS)[None, :, None]  # [SPLIT, BKS, 1]
    for m0 in range(0, n_rows, BM):
        slot = m0 + tl.arange(0, BM)
        valid = slot < n_rows
        if ONE_TOKEN:
            rows = tl.where(valid, slot + s, 0)  # [BM], valid at slot 0 only
        else:
            rows = tl.load(rows_ptr + e * T + slot, mask=valid, other=0)  # [BM] assignments t*k + j
        a_t = a_ptr + rows.to(tl.int64)[None, None, :] * K + kx  # [SPLIT, BKS, BM]
        acc = tl.zeros([SPLIT, BN, BM], tl.float32)
        for k0 in range(0, K, BK):
            # Rows past the expert's are row 0, a real row whose y is never stored: UNMASKED loads
            # them so (moe_common.UNMASKED_ROWS; sm_90a, the BM-8 tile's K loop 728 -> 705
            # instructions). gate_up's split-K kernel keeps its mask: without it its BM-8 tile took
            # 103 registers, not 95, so 4 programs an SM, not 5.
            kmask = (k0 + kx) < K
            at = tl.load(a_t + k0, mask=kmask if UNMASKED else valid[None, None, :] & kmask, other=0.0)
            acc = _v3_split_step(acc, at, w_t, s_t, c, k0, K, BM, BN, BK, SPLIT, EVEN_K, ASM, PREC, WTMA)
        tl.store(
            y_ptr + rows.to(tl.int64)[None, :] * N + n[:, None],
            (tl.sum(acc, 0) + bias).to(y_ptr.dtype.element_ty),  # [BN, BM]
            mask=(n < N)[:, None] & valid[None, :],
        )


def dec_tiles_v3(tokens: int, k: int, t: DecTiles | None = None, experts: int = 0) -> DecTiles:
    """t (default V3_DOWN_DEC, or V3_DOWN_DEC_BIG at moe_v3_dec_sizes.batch_tiles' sizes for `experts`)
    fitted to T = tokens and K = k (moe_v3_dec_sizes.fit_dec_tiles)."""
    if t is None:
        t = batch_tiles(tokens, V3_DOWN_DEC, V3_DOWN_DEC_BIG, experts)
    return fit_dec_tiles(tokens, k, t)


def down_v3_dec(act: Tensor, r: Routing, w: MoEWeights, t: DecTiles | None = None) -> Tensor:
    """act [T*k, I] rows in assignment order -> y [T*k, H] in act.dtype, y[a] = act[a] @ W2_e^T + b2_e
    (moe_v3.down_v3's contract without LoRA or sorted rows) on "v3" weights. t: the tiles before
    dec_tiles_v3 fits them (default: dec_tiles_v3's)."""
    if w.layout != "v3":
        raise ValueError(f"down_v3_dec: weights in the {w.layout!r} layout; it reads the 'v3' layout only")
    _check(act, w)
    a, i = act.shape
    e, h, _ = w.shape
    n_tok = r.ids.shape[0]
    y = common._empty((a, h), act.dtype, act.device)
    if a == 0:
        return y
    tiles = dec_tiles_v3(n_tok, i, t, e)
    act = act.contiguous()  # row stride I
    w2, s2, w_strides, s_strides = _weight_args(w.w2, w.s2, True)
    _down_v3_dec_kernel[(triton.cdiv(h, tiles.bn), min(e, a))](
        act,
        w2,
        s2,
        w.b2,
        y,
        r.counts,
        r.rows,
        n_tok,
        *w_strides,
        *s_strides,
        N=h,
        K=i,
        E=e,
        BE=triton.next_power_of_2(e),
        BM=tiles.bm,
        BN=tiles.bn,
        BK=tiles.bk,
        SPLIT=tiles.split,
        ASM=_scaled(act, True),
        PREC=_precision(act),
        num_warps=tiles.warps,
        num_stages=tiles.stages,
        maxnreg=tiles.maxnreg,
        **pdl.args(act),
        **(
            weight_descriptors(w.w2, w.s2, tiles.bn, tiles.bk)
            if WTMA and _tma_runs(act) and split_copies_fit(tiles)
            else {}
        ),
        ids_ptr=r.ids,
        ONE_TOKEN=n_tok == 1 and r.ids.stride(-1) == 1,
        **common.unmasked_args(),
    )
    return y

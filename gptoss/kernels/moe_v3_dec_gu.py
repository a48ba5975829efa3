"""The v3 layout's gate_up GEMM at decode batch sizes: the split-K expert-slot design of
moe_v3_dec's down (_down_v3_dec_kernel) on W13, with the clamped SwiGLU of moe_v3's tiles.

gate_up_v3_dec(x, r, w, alpha, limit) = moe_v3.gate_up_v3(x, r, w, alpha, limit, tiles) for T <=
moe_tiles.DECODE_MAX_T (no LoRA, act in assignment order): act [T*k, I] = swiglu(x[a // k] @ W13_e^T
+ b13_e) row by row; with logits [T, E] it routes them in registers and fills r, as gate_up_v3 does.

Why. With the down on the split-K kernel, the gate_up on v3's decode tiles (Tiles(16, 32, 128, 4, 4):
64 weight rows, one warpgroup, BK 128) is a decode step's largest kernel at batch 1 (22.3 us a layer
at 120b's shapes on an H100). This kernel runs the down's K step (moe_v3_dec._v3_split_step: a
K step split over warps, each dequantizing whole 64-K chunks of all BN rows into registers that are
the mma.sync A fragment as they stand) on W13, whose rows come gate and up interleaved by 8
(moe_layout._interleave8): a 16-row block is 8 gate rows and their 8 up rows, so a program's BN = 32
weight rows are 16 act columns and the SwiGLU pairs them in registers after the split dim is summed,
as _gate_up_v3_tile does on its wgmma accumulator. K = H = 2880 = 45 x 64: the last K step masks
whole 64-K chunks (the rows are padded to 64 with zeros). Its tiles are not the down's: at T 1 the
gate_up has 720 programs (180 row blocks x 4 experts), which at the down's 4 warps and 109 registers
fit 4 an SM (1.4 waves); 2 warps of one chunk each (78 registers, 7 KB shared) fit 12 (V3_GATE_UP_DEC).

sm_90a SASS (compiled on CPU as bench/kernels/moe_decode_sass.py does; 120b's gate_up, bf16, PDL, the
default tiles), K loop instructions a weight value, registers, shared memory, no spills: BM 1 3.28,
78, 7 KB; BM 4 3.30, 96, 10 KB; BM 8 3.42, 111, 13 KB; BM 16 4.16, 119, 19 KB; routing in registers
T 1 3.31, 80; T 16 4.17, 254 (v3's decode tiles 4.11, 72; the down's tiles here BM 1 2.84, 109, 19 KB).
One convert_layout in the TTGIR (act before its store): the gate / up split stays in registers.

Measured (H100, 120b, bf16; 48 calls in a CUDA graph on random routings, so mostly L2-cold experts;
us a call, two runs on two machines): T 1 17.0-17.3 against 20.6 on v3's decode tiles, 18.0-18.3
against 22.1 routing the logits; T 2 / 4 / 8 34.4 / 59.5 / 102.6 against 36.7 / 62.1 / 111.1; T 16
217.9 against 191.8. In the engine (H100, 20b on one v3 copy, batch-1 128 -> 512, 2026-11-28, v25):
403.5 against 401.9 tok/s on v3's decode tiles, +0.4 %, within the run-to-run spread. 120b (H100,
batch-1 128 -> 512, one process each, 2026-11-28, v26): 280.0 against 298.6 / 300.7 / 298.7 on v3's
decode tiles, -6 %: alone in a graph of 48 copies it is faster, but between the step's other kernels
it was not, because it launched with PDL (v36: this kernel 793-1,127 us a token with PDL, and the
down after it slower too; LAUNCH_PDL below says what fits that). Launched plainly (LAUNCH_PDL off,
as v3's gate_up), on a 256-K step (V3_GATE_UP_DEC), 120b batch-1 128 -> 512 on an H200, one process,
interleaved rounds (v36): 396.9 / 406.1 tok/s against 383.4 / 385.5 on v3's decode tiles (+3.5 /
+5.3 %); gate_up 588 against 723 us a token. TOKENS (GPTOSS_V3_DEC_GATE_UP: N for 1..N, or sizes and
ranges such as 1,2,5-8) are the decode batch sizes that take it, by default
moe_v3_dec_sizes.SPLIT_K_TOKENS (every size 1-16 since v62: the engine measured there, with the split-K down).
Its weight and scale words come by TMA (WTMA, GPTOSS_V3_DEC_GATE_UP_WTMA; the same bits,
interpreter-tested): sm_90a at 120b's T 1 with the routing inside, 128-K steps: 72 registers against
80, the K loop 238 instructions against 212 (two UTMALDG a step, words and scales, instead of 4
cp.async a thread; x stays on cp.async).

Numerics: the same float32 products as v3's tiles (exact dequant, bf16 or IEEE float32 dots), summed
in another order (a partial sum a warp, added after the loop), so act may differ from gate_up_v3's
in the last place, as the down's does.
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
from gptoss.kernels.moe_routing import (
    Routing,
    _topk_one,
    expert_counts,
    route_and_group,
    slot_rows,
    store_one,
)
from gptoss.kernels.moe_tiles import DecTiles
from gptoss.kernels.moe_v3 import _check, _route_args, _scaled, _tma_runs, _weight_args, weight_descriptors
from gptoss.kernels.moe_v3_dec import _v3_split_ptrs, _v3_split_step
from gptoss.kernels.moe_v3_dec_sizes import (
    batch_tiles,
    env_dec_tiles,
    env_tokens,
    fit_dec_tiles,
    split_copies_fit,
)

_ENV = "GPTOSS_V3_DEC_GATE_UP"


def _tokens(v: str | None) -> frozenset[int]:
    # Batch 1 first: launched without PDL (LAUNCH_PDL) it beats v3's decode tiles in the engine, 588
    # against 723 us a token at 120b on an H200 (bench/results v36; it lost with PDL, v26, v33).
    # Batches of 2 and 5-8 since v47, 9-16 since v59 (moe_v3_dec_sizes.SPLIT_K_TOKENS).
    return env_tokens(v, _ENV, "gate_up")


TOKENS = _tokens(os.environ.get(_ENV))


# Whether the kernel launches with PDL (GPTOSS_V3_DEC_GATE_UP_PDL=1). Off: at 120b batch 1 on an H200
# (bench/results v36), v3's gate_up that routes the logits took 727 us a token launched plainly and
# 1,312 with PDL (733 with PDL and at most 3 programs an SM), and the down after it 322 against
# 409-465 when gate_up's release let it be placed during gate_up: consistent with PDL placing a
# kernel's programs on the uneven room the kernel ahead leaves. With PDL this kernel took 793-1,127 us
# a token (v36), which is why it lost in the engine before (v26, v33).
LAUNCH_PDL = common.env_switch("GPTOSS_V3_DEC_GATE_UP_PDL", "0")
# v36's two suspects for that, told apart on an H200 (v40, 120b batch 1): with PDL and a release only
# as its programs exit (so the down is not placed beside it) it still took 865 us a token (385.6
# tok/s); with norm_logits not releasing it either (so it is not placed beside norm_logits) 556 us,
# as launched plainly. The cause is its programs placed beside norm_logits'.
# Weight and scale words by TMA (GPTOSS_V3_DEC_GATE_UP_WTMA, default on; the down's GPTOSS_V3_DEC_WTMA
# is its own): one copy each a K step instead of 16-byte cp.async a lane, the same bits.
WTMA = common.env_switch("GPTOSS_V3_DEC_GATE_UP_WTMA", "1")
# One token routed in the kernel (ROUTE_ONE, GPTOSS_V3_DEC_GATE_UP_ROUTE_ONE, default on): every
# program routes by moe_routing._topk_one (a max of packed keys a choice, not a max and a min) and
# its slot s is the s-th choice, with no lists: sm_90a, 120b's shapes, before the first weight load
# (cp.async), 444 instructions and 13 BAR.SYNC against 708 and 33 through route_in_registers. H200,
# random 120b, batch-1 128 -> 512, one process, interleaved rounds (bench/results v37): 410.2 /
# 413.0 tok/s against 408.1 / 406.7; gate_up 551 against 587 us a token.
ROUTE_ONE = common.env_switch("GPTOSS_V3_DEC_GATE_UP_ROUTE_ONE", "1")
# BN 32 weight rows (16 act columns), BM up to 16 (T's power of 2 at launch), a 256-K step split over
# 2 warps of two 64-K chunks each, 4 stages. In the engine (H200, 120b batch 1, no PDL, bench/results
# v36, us a token): these 588, a 128-K step (one chunk a warp) 623, the same with 6 stages 638.
# Alone (H100, 120b, bf16, us a call at T 1 / 2 / 4 / 16, as above) the 128-K step:
# 17.0 / 34.5 / 60.1 / 220.9; the down's tiles (moe_v3_dec.V3_DOWN_DEC: BK 512 over 4 warps, 3
# stages) 22.1 / 41.1 / 80.4 / 305.7; BK 256 over 4 warps 19.6 (3 stages) - 20.7 (4); BN 64 19.2;
# BK 64 one warp 18.7-18.9; 3 / 5 / 6 stages 17.4 / 17.9 / 18.4 (T 1); the down's tiles capped at
# 96 / 80 registers (5 / 6 an SM) 22.4 / 22.7.
# GPTOSS_V3_DEC_GATE_UP_TILES overrides them.
V3_GATE_UP_DEC = env_dec_tiles(
    "GPTOSS_V3_DEC_GATE_UP_TILES", DecTiles(bm=16, bn=32, bk=256, split=2, warps=2, stages=4)
)
# Batches of 8-16 tokens (moe_v3_dec_sizes.BIG_FROM) and 3-4 (BIG_ALSO, v62): an x tile of 8 rows (4 there),
# 64 weight rows (32 act columns) a program, a 256-K step over 4 warps of one chunk each, 3 stages, at most
# 128 registers (95 by ptxas: 5 programs an SM, not 4); timed with the down's V3_DOWN_DEC_BIG (its comment has
# the figures: 20b M 16's gate_up 87.6 us against 113.3 on the tiles above, v59; the cap 136.3 -> 131.4 at
# 120b's M 16, v60). GPTOSS_V3_DEC_GATE_UP_TILES_BIG overrides them.
V3_GATE_UP_DEC_BIG = env_dec_tiles(
    "GPTOSS_V3_DEC_GATE_UP_TILES_BIG", DecTiles(bm=8, bn=64, bk=256, split=4, warps=4, stages=3, maxnreg=128)
)


@triton.jit(do_not_specialize=["T"])  # T changes every step: no recompiles on its value
def _gate_up_v3_dec_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    b_ptr,
    act_ptr,
    counts_ptr,
    rows_ptr,
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
    SPLIT: tl.constexpr,
    ASM: tl.constexpr,
    PREC: tl.constexpr,
    PDL: tl.constexpr,
    logits_ptr=None,
    ids_ptr=None,
    wts_ptr=None,
    stride_l=0,
    ROUTE: tl.constexpr = False,
    KP: tl.constexpr = 1,
    BT: tl.constexpr = 1,
    w_desc=None,
    s_desc=None,
    WTMA: tl.constexpr = False,
    ONE: tl.constexpr = False,
):
    """Program (weight row block, slot): act[rows of the slot's expert, pid_n's BN/2 columns] =
    swiglu(x[rows // k] @ W13_e^T + b13_e); N = I, K = H, BN weight rows. ROUTE: every program
    routes the [T, E] logits in registers (the routing kernel's decisions) instead of loading counts
    and rows; program (0, 0) stores them for down and the combine. WTMA: the weight and scale words
    come by TMA (w_desc, s_desc: moe_v3.weight_descriptors over W13's E * 2N rows), one copy each a
    K step, as the split-K down takes them."""
    pdl.wait_then_release(PDL)
    pid_n, s = tl.program_id(0), tl.program_id(1)
    if ROUTE and ONE:  # one token: slot s is its j = s-th choice, assignment s (the decode down's)
        ids1, top1, e = _topk_one(logits_ptr, s, E, TOP_K, KP, BE)
        if (pid_n == 0) & (s == 0):
            store_one(ids1, top1, ids_ptr, wts_ptr, counts_ptr, rows_ptr, TOP_K, E, BE)
        n_rows = 1
    else:
        first = (pid_n == 0) & (s == 0)
        flat, a, pos, cnt = expert_counts(
            logits_ptr,
            T,
            stride_l,
            first,
            ids_ptr,
            wts_ptr,
            counts_ptr,
            rows_ptr,
            E,
            TOP_K,
            KP,
            BE,
            BT,
            ROUTE,
        )
        e, n_rows, _ = _slot_expert(cnt, tl.arange(0, BE), s)
        if n_rows == 0:  # past the active experts
            return
    EVEN_K: tl.constexpr = (K + 63) // 64 * 64 % BK == 0  # the rows are padded to 64
    BKS: tl.constexpr = BK // SPLIT
    NC: tl.constexpr = BN // 2  # act columns: each a gate and an up weight row
    e64 = e.to(tl.int64)
    if WTMA:  # the tile's first 16-row block in the [E * 2N/16, ...] descriptors
        w_t, s_t, c = w_desc, s_desc, e * (2 * N // 16) + pid_n * (BN // 16)
    else:
        args = (w_ptr, s_ptr, e, pid_n * BN, stride_we, stride_wn, stride_se, stride_sn)
        w_t, s_t, c = _v3_split_ptrs(*args, 2 * N, BN, BK, SPLIT)
    # Weight row r = 16b + 8h + g is plane h's (gate, up) act column pid_n NC + 8b + g (_interleave8);
    # past-the-end columns read valid bias and are never stored.
    r = tl.arange(0, BN)
    col = (pid_n * NC + (r // 16) * 8 + r % 8) % N
    bias = tl.load(b_ptr + e64 * 2 * N + ((r // 8) % 2) * N + col)[:, None]  # [BN, 1]: b13 is [E, 2, I]
    n = pid_n * NC + tl.arange(0, NC)
    kx = tl.arange(0, SPLIT)[:, None, None] * BKS + tl.arange(0, BKS)[None, :, None]  # [SPLIT, BKS, 1]
    for m0 in range(0, n_rows, BM):
        slot = m0 + tl.arange(0, BM)
        valid = slot < n_rows
        if ROUTE and ONE:
            rows = slot + s  # [BM], valid at slot 0 only
        else:  # routed in registers, rows_ptr not yet written; or the routing kernel's lists
            rows = slot_rows(flat, a, pos, rows_ptr, e, slot, valid, T, ROUTE)  # [BM] assignments t*k + j
        x_t = x_ptr + (rows // TOP_K).to(tl.int64)[None, None, :] * stride_x + kx  # [SPLIT, BKS, BM]
        acc = tl.zeros([SPLIT, BN, BM], tl.float32)
        for k0 in range(0, K, BK):
            xt = tl.load(x_t + k0, mask=valid[None, None, :] & ((k0 + kx) < K), other=0.0)
            acc = _v3_split_step(acc, xt, w_t, s_t, c, k0, K, BM, BN, BK, SPLIT, EVEN_K, ASM, PREC, WTMA)
        pre = tl.sum(acc, 0) + bias  # [BN, BM]
        # rows 16b + 8h + g -> [b, g, BM, h], split on h: _gate_up_v3_tile's epilogue
        gate, up = tl.split(tl.permute(tl.reshape(pre, (BN // 16, 2, 8, BM)), (0, 2, 3, 1)))
        gate = tl.minimum(tl.reshape(gate, (NC, BM)), limit)  # act column pid_n NC + 8b + g
        up = tl.minimum(tl.maximum(tl.reshape(up, (NC, BM)), -limit), limit)
        act = (up + 1.0) * (gate * tl.sigmoid(alpha * gate))
        tl.store(
            act_ptr + rows.to(tl.int64)[None, :] * N + n[:, None],
            act.to(act_ptr.dtype.element_ty),
            mask=(n < N)[:, None] & valid[None, :],
        )


def gate_up_v3_dec(
    x: Tensor,
    r: Routing,
    w: MoEWeights,
    alpha: float,
    limit: float,
    t: DecTiles | None = None,
    logits: Tensor | None = None,
) -> Tensor:
    """x [T, H] -> act [T*k, I] in x.dtype, rows in assignment order, act[a] = swiglu(x[a // k] @
    W13_e^T + b13_e) (moe_v3.gate_up_v3's contract without LoRA or sorted rows) on "v3" weights.
    t: the tiles before fit_dec_tiles fits them to T and K = H (default V3_GATE_UP_DEC, from
    moe_v3_dec_sizes.batch_tiles' sizes V3_GATE_UP_DEC_BIG; BN counts weight rows, two an act column).
    logits [T, E]: r's buffers (empty on entry) are filled with their routing for down and the
    combine, by the kernel itself where T fits one x tile (T <= the fitted BM), else by
    route_and_group's launch before it."""
    if w.layout != "v3":
        raise ValueError(f"gate_up_v3_dec: weights in the {w.layout!r} layout; it reads the 'v3' layout only")
    _check(x, w)
    (n_tok, h), k = x.shape, r.ids.shape[1]
    e, _, i = w.shape
    t = batch_tiles(n_tok, V3_GATE_UP_DEC, V3_GATE_UP_DEC_BIG, e) if t is None else t
    tiles = fit_dec_tiles(n_tok, h, t)
    if logits is not None and n_tok > tiles.bm:  # in the kernel, every row of the batch in one x tile
        route_and_group(logits, k, out=r)
        logits = None
    act = common._empty((n_tok * k, i), x.dtype, x.device)
    if n_tok == 0:
        return act
    if x.stride(1) != 1:  # the kernel reads a row's K contiguous (stride_x between rows)
        x = x.contiguous()
    w13, s13, w_strides, s_strides = _weight_args(w.w13, w.s13, True)
    _gate_up_v3_dec_kernel[(triton.cdiv(2 * i, tiles.bn), min(e, n_tok * k))](
        x,
        w13,
        s13,
        w.b13,
        act,
        r.counts,
        r.rows,
        n_tok,
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
        SPLIT=tiles.split,
        ASM=_scaled(x, True),
        PREC=_precision(x),
        **_route_args(logits, r, n_tok, k),
        num_warps=tiles.warps,
        num_stages=tiles.stages,
        maxnreg=tiles.maxnreg,
        **pdl.args(x, LAUNCH_PDL),
        ONE=ROUTE_ONE and n_tok == 1 and logits is not None,
        **(
            weight_descriptors(w.w13, w.s13, tiles.bn, tiles.bk)
            if WTMA and _tma_runs(x) and split_copies_fit(tiles)
            else {}
        ),
    )
    return act

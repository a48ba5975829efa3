"""Where a batch-1 decode MoE GEMM's time goes: the split-K decode kernels' structure (moe_v3_dec's
down, moe_v3_dec_gu's gate_up: same grid, tiles, TMA copies and pipeline) with parts taken away.

ablate(x, ids, w, s, n, k, tiles, mode, kparts) -> out, one program a (BN rows, slot, K part):
- "full": the production K step (moe_v3_dec._v3_split_step: TMA words, dequant, mma.sync), out
  [kparts, slots, n] float32 partial sums of W_e @ x over the part's K steps (no bias, no SwiGLU);
- "nodeq": the same loads and dot with the words put into the dot's registers undecoded (garbage
  values, the dequant's instructions gone), out as "full" (meaningless but kept alive);
- "dequant": the same copies and dequant, no dot: the decoded bf16 bits XORed, out as "loads";
- "loads": the same TMA copies only (pipelined as the dot's), XORed, out [kparts, slots, n / BN] int32;
- "words": the weight words' copies only (no scale words), as "loads";
- "loads_sp": the words by TMA and the scale words by plain loads (the pipeline's cp.async), as "loads".
kparts > 1 splits each program's K steps over that many programs (more warps an SM, each a shorter
chain), as a split-K over programs would; the partial sums are left unsummed (timing only).

Timing: moe_ablate_gpu.py. Tests: tests/bench/test_moe_ablate.py (interpreter, against torch).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gptoss.kernels.moe_common import _precision
from gptoss.kernels.moe_tiles import DecTiles
from gptoss.kernels.moe_v3 import _scaled, weight_descriptors
from gptoss.kernels.moe_v3_dec import _v3_split_step
from gptoss.kernels.moe_v3_step import _dequant_v3

MODES = {"full": 2, "nodeq": 1, "loads": 0, "dequant": 3, "words": 4, "loads_sp": 5}


@triton.jit
def _xor(a, b):
    return a ^ b


@triton.jit
def _nodeq_step(acc, x, w_desc, s_desc, c, k0, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                SPLIT: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """_v3_split_step's copies, reorders and dot, with each word's bits as 4 bf16 pairs instead of
    decoded (8 fp4 values -> 8 bf16 values, as the dequant's output count). Returns (acc, scales)."""
    RB: tl.constexpr = BN // 16
    KCS: tl.constexpr = BK // SPLIT // 64
    w = tl.permute(tl.reshape(w_desc.load([c, k0 // 64, 0]), (RB, SPLIT, KCS, 8, 4, 4)), (1, 0, 2, 3, 4, 5))
    s = s_desc.load([c, k0 // 64, 0])
    w = tl.reshape(w, (SPLIT * RB, KCS, 8, 4, 2, 2)).to(tl.uint32, bitcast=True)
    q = tl.join(tl.join(w, w), tl.join(w, w))  # [rb, kc, g, t, s2, s1, h, q]
    lo = (q & 0xFFFF).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    hi = (q >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    v = tl.permute(tl.join(lo, hi), (0, 6, 2, 1, 4, 5, 7, 3, 8))  # _dequant_v3's output order
    wd = tl.reshape(v, (SPLIT * RB * 16, KCS * 64)).to(x.dtype)
    wd = tl.permute(tl.reshape(wd, (SPLIT, BN, KCS * 4, 2, 4, 2)), (0, 1, 2, 4, 3, 5))
    xs = tl.permute(tl.reshape(x, (SPLIT, KCS * 4, 2, 4, 2, BM)), (0, 1, 3, 2, 4, 5))
    acc = tl.dot(
        tl.reshape(wd, (SPLIT, BN, KCS * 64)),
        tl.reshape(xs, (SPLIT, KCS * 64, BM)),
        acc,
        input_precision=PREC,
    )
    return acc, s


@triton.jit
def _ablate_kernel(
    x_ptr,
    ids_ptr,
    out_ptr,
    s_ptr,
    w_desc,
    s_desc,
    N: tl.constexpr,
    K: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    SPLIT: tl.constexpr,
    STEPS: tl.constexpr,
    MODE: tl.constexpr,
    ASM: tl.constexpr,
    PREC: tl.constexpr,
    WTMA: tl.constexpr = True,  # weight_descriptors' flag: the copies here are always TMA's
    NS: tl.constexpr = 3,
):
    pid_n, s, p = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n_slots, n_blocks = tl.num_programs(1), tl.num_programs(0)
    e = tl.load(ids_ptr + s)
    c = e * (N // 16) + pid_n * (BN // 16)  # the tile's first 16-row block in the descriptors
    k_lo = p * STEPS * BK
    k_hi = tl.minimum(k_lo + STEPS * BK, K)
    RB: tl.constexpr = BN // 16
    if MODE == 0 or MODE == 4 or MODE == 5:
        aw = tl.zeros([RB, BK // 64, 128], tl.int32)
        as_ = tl.zeros([RB, BK // 64, 8], tl.int32)
        KC: tl.constexpr = (K + 63) // 64  # chunks a row block in the scale words
        kc = tl.arange(0, BK // 64)[None, :, None]
        s_t = s_ptr + (c + tl.arange(0, RB))[:, None, None].to(tl.int64) * (KC * 8) + kc * 8
        s_t += tl.arange(0, 8)[None, None, :]
        for k0 in tl.range(k_lo, k_hi, BK, num_stages=NS):  # pipelined as the dot's loads are
            aw ^= w_desc.load([c, k0 // 64, 0])
            if MODE == 0:
                as_ ^= s_desc.load([c, k0 // 64, 0])
            elif MODE == 5:  # the scale words by plain loads (cp.async in the pipeline), not a 2nd TMA copy
                as_ ^= tl.load(s_t + (k0 // 64) * 8, mask=(k0 // 64 + kc) < KC, other=0)
        r = tl.reduce(tl.reshape(aw, (RB * BK // 64 * 128,)), 0, _xor)
        r ^= tl.reduce(tl.reshape(as_, (RB * BK // 64 * 8,)), 0, _xor)
        tl.store(out_ptr + (p * n_slots + s) * n_blocks + pid_n, r)
    elif MODE == 3:
        ad = tl.zeros([BN, BK], tl.int16)
        for k0 in tl.range(k_lo, k_hi, BK, num_stages=NS):
            w = tl.reshape(w_desc.load([c, k0 // 64, 0]), (RB, BK // 64, 8, 4, 4))
            sw = tl.reshape(s_desc.load([c, k0 // 64, 0]), (RB, BK // 64, 8))
            ad ^= _dequant_v3(w, sw, RB, BK // 64, tl.bfloat16, ASM).to(tl.int16, bitcast=True)
        tl.store(
            out_ptr + (p * n_slots + s) * n_blocks + pid_n, tl.reduce(tl.reshape(ad, (BN * BK,)), 0, _xor)
        )
    else:
        BKS: tl.constexpr = BK // SPLIT
        kx = tl.arange(0, SPLIT)[:, None, None] * BKS + tl.arange(0, BKS)[None, :, None]
        one = (tl.arange(0, BM) == 0)[None, None, :]  # one token: column 0 of the BM tile
        x_t = x_ptr + kx + tl.zeros([1, 1, BM], tl.int32)
        acc = tl.zeros([SPLIT, BN, BM], tl.float32)
        sx = tl.zeros([BN // 16, BK // 64, 8], tl.int32)
        for k0 in tl.range(k_lo, k_hi, BK, num_stages=NS):
            xt = tl.load(x_t + k0, mask=one & ((k0 + kx) < K), other=0.0)
            if MODE == 2:
                acc = _v3_split_step(
                    acc, xt, w_desc, s_desc, c, k0, K, BM, BN, BK, SPLIT, True, ASM, PREC, True
                )
            else:
                acc, sw = _nodeq_step(acc, xt, w_desc, s_desc, c, k0, BM, BN, BK, SPLIT, PREC)
                sx ^= sw
        pre = tl.sum(acc, 0)  # [BN, BM]
        col = tl.sum(tl.where((tl.arange(0, BM) == 0)[None, :], pre, 0.0), 1)  # [BN]
        if MODE == 1:  # keep the scale copies alive
            col += tl.reduce(tl.reshape(sx, (BN // 16 * BK // 64 * 8,)), 0, _xor).to(tl.float32) * 0.0
        n = pid_n * BN + tl.arange(0, BN)
        tl.store(out_ptr + (p * n_slots + s) * N + n, col, mask=n < N)


def ablate(
    x: torch.Tensor,
    ids: torch.Tensor,
    w: torch.Tensor,
    s: torch.Tensor,
    k: int,
    tiles: DecTiles,
    mode: str,
    kparts: int = 1,
    stages: int | None = None,
) -> torch.Tensor:
    """x [1, K] one token, ids [slots] int32 experts, w / s: a "v3" GEMM's words [E, N, Kp/2] and
    scales (MoEWeights.w13/s13 or w2/s2); k = K. See the module's doc for out."""
    _, n, _ = w.shape
    steps = triton.cdiv(triton.cdiv(k, 64) * 64, tiles.bk)
    if not 1 <= kparts <= steps:
        raise ValueError(f"ablate: kparts {kparts} must be within 1..{steps} (the K steps)")
    per = triton.cdiv(steps, kparts)
    kparts = triton.cdiv(steps, per)  # no empty parts
    slots = ids.numel()
    grid = (triton.cdiv(n, tiles.bn), slots, kparts)
    if mode in ("loads", "dequant", "words", "loads_sp"):
        out = torch.empty((kparts, slots, grid[0]), dtype=torch.int32, device=x.device)
    else:
        out = torch.empty((kparts, slots, n), dtype=torch.float32, device=x.device)
    _ablate_kernel[grid](
        x,
        ids,
        out,
        s.reshape(-1).view(torch.int32),  # the scale words [E*N/16, Kc, 8], flat
        N=n,
        K=k,
        BM=tiles.bm,
        BN=tiles.bn,
        BK=tiles.bk,
        SPLIT=tiles.split,
        STEPS=per,
        MODE=MODES[mode],
        ASM=_scaled(x, True),
        PREC=_precision(x),
        num_warps=tiles.warps,
        NS=tiles.stages if stages is None else stages,
        num_stages=tiles.stages if stages is None else stages,
        **weight_descriptors(w, s, tiles.bn, tiles.bk),
    )
    return out

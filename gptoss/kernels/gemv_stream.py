"""Decode projection y = x @ W^T + b for one or two tokens on a grid that fits the GPU at once: each
program walks several blocks of W's rows, the next block's loads in flight while it sums the current.

Why. gemv_preload gives every BN rows of W a program of their own: QKV [5120, 2880] is 2,560
programs of 2 rows, ~4 waves of the ~660 that fit an H200 at once, O [2880, 4096] 1,440. A program
loads its rows in one burst, waits a DRAM round trip, sums and exits; its SM slot then has nothing
in flight until the next program has been placed and its loads have left. Alone that streams QKV at
~2.9 TB/s and O at ~3.0 (bench/results v31: 10.23 and 7.85 us), against the ~4.4 a long stream
reaches (the lm_head's 1.16 GB: 259 us a token, v38). Here the grid is at most PER_SM programs an SM
(one wave: PER_SM says why it fits), and program p takes blocks p, p + G, p + 2G, ...: each
iteration first issues the next block's loads, then sums the current one, so a program keeps one to
two blocks in flight from start to end and no slot waits for a placement. The program's first block
loads before the PDL wait, as gemv_preload's whole grid would if it fitted at once; x loads once
after the wait and stays in registers for every block.

Numerics: the same tiles and sums as gemv_preload's at the same BN and warps ([BN, K1] + [BN, K2],
float32 products summed by tl.sum, plus the bias, one rounding), so its rows are those bits.

G, the programs: the fewest that give no more blocks a program than PER_SM programs an SM would
(ceil(blocks / ceil(blocks / (SMs * PER_SM)))), so every program walks the same number of blocks,
give or take one. Untimed (2026-12-01: written without a GPU); linear.GEMV = "stream" takes it
(GPTOSS_GEMV=stream), for the next A/B call.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl
from torch import Tensor

from gptoss.kernels import device_info, l2_prefetch, pdl
from gptoss.kernels.gemv_preload import _sums, _x_row, checked_output, k_parts, tiles_from_env
from gptoss.kernels.l2_prefetch import prefetch_part
from gptoss.kernels.rounding import round_to

# The interpreter's "SMs": a grid of a few programs, so the tests walk several blocks a program.
SMS_OFF_GPU = 2


def per_sm_from_env(v: str | None) -> tuple[int, int]:
    """GPTOSS_GEMV_STREAM_PER_SM="ONE[,TWO]": programs an SM for one-token and two-token launches
    (unset: 4, 3). The grid must fit at once: sm_90a, bf16, BN 2 x 4 warps, O's K 4096 / QKV's 2880
    (bench/kernels/pdl_wait_sass.py): one token 114 / 94 registers a thread, so 4 / 5 programs fit an
    SM's 64K; two tokens 168 / 154, so 3."""
    if v in (None, ""):
        return 4, 3
    parts = v.split(",")
    if len(parts) > 2 or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise ValueError(f"GPTOSS_GEMV_STREAM_PER_SM must be ONE[,TWO], programs an SM >= 1, got {v!r}")
    return int(parts[0]), int(parts[-1])


PER_SM = per_sm_from_env(os.environ.get("GPTOSS_GEMV_STREAM_PER_SM"))
# GPTOSS_GEMV_STREAM_L2=D (default 0: off): each iteration also asks L2 for the block D iterations
# ahead (one bulk prefetch, l2_prefetch.prefetch_part), so the next block's loads find it there. Why:
# in the sm_90a SASS (BN 2, QKV) ptxas issues the next block's loads halfway through the current
# block's sums, not before them, so a program has one block in flight for part of each iteration
# only; a prefetch holds no register. Where bulk prefetches run (Hopper, compiled) and W's rows
# are contiguous. Untimed.
L2_AHEAD = int(os.environ.get("GPTOSS_GEMV_STREAM_L2", "0") or 0)
# Blocks a program loads before the PDL wait, (tall W: QKV, N > K; wide W: O): 1 or 2 each (default 1,
# 1; a module switch for bench/decode_ab_gpu.py). Why 2 for QKV: the add + RMSNorm before it is one
# program of ~3.6 us that moves ~30 KB, room for ~15 MB of QKV's 29.5 (4.4 TB/s) where one block a
# program preloads ~6 MB; before O runs attention, which the preloads slowed before (v31). Untimed.
PRE = (1, 1)
TILE = tiles_from_env(os.environ.get("GPTOSS_GEMV_STREAM_TILE"), "GPTOSS_GEMV_STREAM_TILE")  # (BN, warps)


def programs(blocks: int, slots: int) -> int:
    """How many programs walk `blocks` row blocks with at most `slots` of them: the fewest that keep
    the most blocks a program at ceil(blocks / slots)."""
    if blocks < 1 or slots < 1:
        raise ValueError(f"programs: blocks and slots must be >= 1, got {blocks}, {slots}")
    return triton.cdiv(blocks, triton.cdiv(blocks, slots))


@triton.jit
def _rows(w_ptr, b_ptr, blk, nblk, N, K, stride_w, HAS_BIAS: tl.constexpr, BN: tl.constexpr, K1, K2):
    """Block blk's W tiles [BN, K1], [BN, K2] and bias [BN] float32; nothing moves when blk >= nblk
    (masked: zeros). Rows past N are clamped, as gemv_preload's, and dropped at the store."""
    live = blk < nblk
    rows = blk * BN + tl.arange(0, BN)
    w_rows = w_ptr + tl.minimum(rows, N - 1).to(tl.int64)[:, None] * stride_w  # [BN, 1]
    kk1 = tl.arange(0, K1)[None, :]
    w1 = tl.load(w_rows + kk1, mask=live & (kk1 < K1), other=0.0)
    w2 = w1  # unused unless K2 > 0
    if K2 > 0:
        kk2 = K1 + tl.arange(0, K2)[None, :]
        w2 = tl.load(w_rows + kk2, mask=live & (kk2 < K), other=0.0)
    bias = tl.zeros((BN,), dtype=tl.float32)
    if HAS_BIAS:
        bias = tl.load(b_ptr + tl.minimum(rows, N - 1), mask=live & (rows < N), other=0.0).to(tl.float32)
    return w1, w2, bias


@triton.jit(do_not_specialize=["T"])
def _gemv_stream_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    T,
    N,
    K,
    stride_x,
    stride_w,
    stride_y,
    HAS_BIAS: tl.constexpr,
    BN: tl.constexpr,
    K1: tl.constexpr,
    K2: tl.constexpr,
    TWO: tl.constexpr,  # MAX_T 2: a second token's x row in registers too
    PDL: tl.constexpr,
    L2_AHEAD: tl.constexpr = 0,  # blocks ahead to prefetch into L2 (0: none)
    NT: tl.constexpr = 128,  # threads a program (32 * num_warps), for the prefetch's chunks
    PRE: tl.constexpr = 1,  # blocks whose loads leave before the PDL wait: 1, or 2
):
    """Program p: row blocks p, p + G, ... (G programs), y[t, block] = x[t] @ W[block]^T + b."""
    pid, g = tl.program_id(0), tl.num_programs(0)
    nblk = tl.cdiv(N, BN)
    # W and the bias never change: the first block's loads (PRE 2: the second's too) leave before the
    # PDL wait. The second block's registers are the loop's next-block buffer, so PRE 2 costs none.
    w1, w2, bias = _rows(w_ptr, b_ptr, pid, nblk, N, K, stride_w, HAS_BIAS, BN, K1, K2)
    n1, n2, nbias = w1, w2, bias
    if PRE == 2:
        n1, n2, nbias = _rows(w_ptr, b_ptr, pid + g, nblk, N, K, stride_w, HAS_BIAS, BN, K1, K2)
    pdl.wait_then_release(PDL)
    xa1, xa2 = _x_row(x_ptr, K, K1, K2, True)
    xb1, xb2 = xa1, xa2
    if TWO:
        xb1, xb2 = _x_row(x_ptr + stride_x, K, K1, K2, T > 1)
    for blk in range(pid, nblk, g):
        if L2_AHEAD > 0:  # rows contiguous (the host checks): block blk + D*g's bytes, clamped to W's end
            ahead = blk + L2_AHEAD * g
            left = tl.maximum(tl.minimum(N - ahead * BN, BN), 0)
            prefetch_part(w_ptr + ahead.to(tl.int64) * BN * stride_w, left * K * 2, 0, 1, NT)
        if PRE == 1:  # the next block's loads first: in flight while this block is summed and stored
            n1, n2, nbias = _rows(w_ptr, b_ptr, blk + g, nblk, N, K, stride_w, HAS_BIAS, BN, K1, K2)
        rows = blk * BN + tl.arange(0, BN)
        acc = _sums(w1, w2, xa1, xa2, K2) + bias
        tl.store(y_ptr + rows, round_to(acc, y_ptr.dtype.element_ty), mask=rows < N)
        if TWO:
            acc = _sums(w1, w2, xb1, xb2, K2) + bias
            tl.store(
                y_ptr + stride_y + rows, round_to(acc, y_ptr.dtype.element_ty), mask=(rows < N) & (T > 1)
            )
        w1, w2, bias = n1, n2, nbias
        if PRE == 2:  # the next block is loaded already: the one after it, behind this block's sums
            n1, n2, nbias = _rows(w_ptr, b_ptr, blk + 2 * g, nblk, N, K, stride_w, HAS_BIAS, BN, K1, K2)


def _pre(v: int) -> int:
    if v not in (1, 2):
        raise ValueError(f"gemv_stream.PRE: 1 or 2 blocks before the PDL wait, got {v!r}")
    return v


def _prefetches(x: Tensor, w: Tensor) -> bool:
    """Whether L2_AHEAD's bulk prefetches may run: compiled on Hopper, W's rows contiguous, 2-byte
    elements and K % 8 == 0, so every row (and block) starts 16-byte aligned and ends on 16 bytes."""
    return (
        L2_AHEAD > 0
        and l2_prefetch.supported(x)
        and w.stride(0) == w.shape[1]
        and w.element_size() == 2
        and w.data_ptr() % 16 == 0
        and w.shape[1] % 8 == 0
    )


def gemv_stream(
    x: Tensor,
    w: Tensor,
    b: Tensor | None = None,
    *,
    block_n: int | None = None,
    num_warps: int | None = None,
    per_sm: int | None = None,
) -> Tensor:
    """x [T, K], w [N, K], b [N] | None -> y [T, N] = x @ w^T + b, T <= gemv_preload.MAX_T (the operands
    gemv_preload takes); tiles default to TILE, programs an SM to PER_SM's for T."""
    t, k, n, y = checked_output("gemv_stream", x, w, b)
    if n == 0:
        return y
    bn, warps = block_n or TILE[0], num_warps or TILE[1]
    k1, k2 = k_parts(k)
    sms = device_info.sm_count(x) if x.is_cuda else SMS_OFF_GPU
    per_sm = per_sm or PER_SM[t > 1]
    _gemv_stream_kernel[(programs(triton.cdiv(n, bn), sms * per_sm),)](
        x,
        w,
        b if b is not None else w,
        y,
        t,
        n,
        k,
        x.stride(0),
        w.stride(0),
        y.stride(0),
        HAS_BIAS=b is not None,
        BN=bn,
        K1=k1,
        K2=k2,
        TWO=t > 1,
        L2_AHEAD=L2_AHEAD if _prefetches(x, w) else 0,
        PRE=_pre(PRE[0] if n > k else PRE[1]),
        NT=32 * warps,
        num_warps=warps,
        num_stages=1,
        **pdl.args(x),
    )
    return y

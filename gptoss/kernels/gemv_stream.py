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
give or take one.

Measured (H200, bench/results v40): alone at T 1 (a CUDA graph of 24), QKV 9.08 us against
gemv_preload's 9.83 (3.25 against 3.00 TB/s) and O 6.77 against 7.77; at T 2, O 7.78 against 8.80.
In the engine, 120b batch-1 128 -> 512, the projections added 481 us a token against 512: 445.0 /
445.3 tok/s against 438.6 / 437.2 (one machine), 435.2 / 432.8 against 425.8 / 425.5 (another). It is
linear()'s default (GPTOSS_GEMV=stream). Lost and removed: an L2 bulk prefetch of the block two
iterations ahead (413.1 tok/s: the projections 669 us a token) and QKV's second block loaded before
the PDL wait too (431.7); 5 programs an SM for one token were noise (444.7, PER_SM below).
"""

from __future__ import annotations

import os

import triton
import triton.language as tl
from torch import Tensor

from gptoss.kernels import device_info, pdl
from gptoss.kernels.gemv_preload import _sums, _x_row, checked_output, k_parts, tiles_from_env
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
):
    """Program p: row blocks p, p + G, ... (G programs), y[t, block] = x[t] @ W[block]^T + b."""
    pid, g = tl.program_id(0), tl.num_programs(0)
    nblk = tl.cdiv(N, BN)
    # W and the bias never change: the first block's loads leave before the PDL wait.
    w1, w2, bias = _rows(w_ptr, b_ptr, pid, nblk, N, K, stride_w, HAS_BIAS, BN, K1, K2)
    pdl.wait_then_release(PDL)
    xa1, xa2 = _x_row(x_ptr, K, K1, K2, True)
    xb1, xb2 = xa1, xa2
    if TWO:
        xb1, xb2 = _x_row(x_ptr + stride_x, K, K1, K2, T > 1)
    for blk in range(pid, nblk, g):
        # the next block's loads first: in flight while this block is summed and stored
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
        num_warps=warps,
        num_stages=1,
        **pdl.args(x),
    )
    return y

"""Next-token draw on the device: greedy argmax or Gumbel-max (noise: gptoss.kernels.sampling_noise),
no host sync.

logits [B, V] float32 or bfloat16 -> ids [B] int64. Two kernels: pass 1 splits each row into chunks
(grid [B, ceil(V/CHUNK)]; rows shorter than a step (BLOCK) share a program), each keeps the first
index of the max of
    z_i = logits_i / T + g_i   (sampled rows, T > 0)      or      z_i = logits_i   (T == 0),
pass 2 reduces the chunk winners of a row (largest z, then the smallest index). Bytes moved: one read
of the logits (804 KB a float32 row at V = 201088, half in bf16) plus 8 bytes per chunk; at B = 1024
float32, about 824 MB. Top-k / top-p rows are filtered first (gptoss.kernels.sampling_filter), or as
the draw reads (a cut): gptoss.kernels.sampling.sample composes them.

Why Gumbel-max samples softmax(logits/T): with E_i iid Exp(1), P(E_i/p_i is the smallest) =
p_i / sum_j p_j (a race of exponential clocks with rates p_j), and argmin_i E_i/p_i =
argmax_i log p_i - log E_i = argmax_i logits_i/T + g_i with g_i = -log E_i ~ Gumbel(0, 1); the
normaliser of softmax shifts every z_i alike and drops out. No exp, no sum, one pass over V.
Every z_i depends on (logits_i, T, seed, offset, i) only and argmax is exact, so a row's id does not
depend on its batch position, the batch size or the chunking.

A row holding a NaN logit returns -1 (never a made-up id): the engine must fail that request.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from gptoss.kernels.sampling_noise import _gumbel, _gumbel_bound, _row_keys, _uniform

_BLOCK = 1024  # elements per loop step of a pass-1 program
# Screening (_chunk_winner's SCREEN): each step first bounds its z from the hash's bits alone
# (_gumbel_bound: a few integer and float operations) and takes the two logs only when some bound
# could beat the best z seen so far. The draw is bound by its instructions, not by HBM (v69: bf16
# logits, half the bytes, take 635 us at B 1024 against float32's 662), and in a chunk of n steps step
# k holds a new best with odds ~1/k. 0: off. 1: the best z of the program's own earlier steps. 2:
# also the best any chunk of the row has kept, shared through a [B] float32 of atomic maxima, so later
# chunks skip from their first step. The same ids bit for bit in every mode (tests): a skipped z is
# beaten, or tied at a smaller index, by a z that is kept. Timed on an H100 (v69, ops rows, µs a call
# against SCREEN 0): mode 1 B 1 6.5 vs 5.3, B 64 52.3 vs 54.4, B 256 154.8 vs 179.5, B 1024 583.0 vs
# 662.5; mode 2 no better at 1024 and 2x slower at 64 (its atomics). So launches of SCREEN_FROM rows or
# more screen in mode SCREEN, smaller ones (a row's chunk a program, few steps to screen) do not.
SCREEN = 1
SCREEN_FROM = 64
# The launch's shape: the most elements a pass-1 program draws (a chunk; _chunk_size) and its warps.
CHUNK_MAX = 16384
WARPS = 4
# A screened unfiltered launch's shape (launch_shape): steps of 256 on one warp, chunks of up to 8,192.
# At 1,024 on 4 warps each screened step ended in a block-wide reduction (6 BAR.SYNC in the sm_90a
# loop); one warp has none, and 4x the steps a chunk give the screen a longer history (step k of n holds
# a new best with odds ~1/k). Swept on an H200 (v70, bench/kernels/draw_sweep_gpu.py, µs a call, bf16
# against 1,024 x 4 at chunks of 16,384): B 64 37.9 vs 37.9, 128 66.2 vs 67.8, 256 107.2 vs 120.8, 512
# 197.2 vs 228.9, 1024 375.0 vs 449.4; float32 1.05-1.42x. The cut's launches keep the shape above.
SCREEN_BLOCK = 256
SCREEN_WARPS = 1
SCREEN_CHUNK_MAX = 8192


@triton.jit
def _keep_first_max(z, idx, best, best_i):
    """Strict >: a lane sees increasing indices, so it keeps the first of equal maxima."""
    better = z > best
    return tl.where(better, z, best), tl.where(better, idx, best_i)


@triton.jit
def _chunk_winner(
    logits_ptr,
    stride_row,
    temp_ptr,
    seed_ptr,
    off_ptr,
    rows,
    rmask,
    V,
    tau,
    cut,
    CHUNK,
    BLOCK,
    floor_ptr,
    CUT: tl.constexpr,
    SCREEN: tl.constexpr,
):
    """Rows [R] of chunk program_id(1), in [R, BLOCK] steps -> (max z [R], its first index, has NaN).
    CUT: only logits above the row's tau [R, 1], or equal to it at an index <= its cut [R, 1], or
    NaN, take part (filter_cut's cut: what mask_within_top_k's masked copy keeps, read in place).
    SCREEN (the switch above) 1: a step whose bounds (_gumbel_bound) all stay <= the best z its
    program has seen skips the logs: none of its z can beat that z, and a tie would sit at a later
    index. 2: also when they all stay < the best z any chunk of the row has kept (floor_ptr [B], a
    max shared through atomics): then none can even tie the row's winner. Either way the chunk may
    keep less than its own max, but only when another element (kept) beats or ties it earlier."""
    temp = tl.load(temp_ptr + rows, mask=rmask, other=0.0)  # [R]
    sampled = temp > 0
    any_sampled = tl.max(sampled.to(tl.int32), axis=0) > 0
    temp = tl.where(sampled, temp, 1.0)  # 1 where unused
    # x / 1 is x: a program whose rows are all at temperature 1 (or greedy) skips the division.
    scaled = tl.max((temp != 1.0).to(tl.int32), axis=0) > 0
    temp, sampled = temp[:, None], sampled[:, None]  # [R, 1]
    k0, k1 = _row_keys(seed_ptr, off_ptr, rows, rmask)
    k0, k1 = k0[:, None], k1[:, None]
    start = tl.program_id(1) * CHUNK
    lanes = tl.arange(0, BLOCK)[None, :]  # [1, BLOCK]
    best = tl.full([rows.shape[0], BLOCK], float("-inf"), tl.float32)
    # An all -inf chunk yields its first index, as torch.argmax does.
    best_i = tl.zeros([rows.shape[0], BLOCK], tl.int32) + start + lanes
    seen = tl.full([rows.shape[0]], float("-inf"), tl.float32)  # SCREEN: each row's best z so far
    nan = tl.zeros([rows.shape[0], BLOCK], tl.int32)
    for s in range(start, tl.minimum(start + CHUNK, V), BLOCK):  # the last chunk stops at V
        idx = s + lanes  # [1, BLOCK]
        x = tl.load(
            logits_ptr + rows[:, None] * stride_row + idx,
            mask=rmask[:, None] & (idx < V),
            other=float("-inf"),
        ).to(tl.float32)  # [R, BLOCK]; bf16 logits widen exactly
        is_nan = x != x  # noqa: PLR0124 (NaN test)
        nan |= is_nan.to(tl.int32)
        if CUT:  # NaN stays (the row then yields -1, as unfiltered)
            x = tl.where((x > tau) | ((x == tau) & (idx <= cut)) | is_nan, x, float("-inf"))
        if SCREEN == 2:  # volatile: another program's atomic_max lands in L2, not in this L1
            floor = tl.load(floor_ptr + rows, mask=rmask, other=float("-inf"), volatile=True)[:, None]
        if any_sampled:  # a uniform branch: all-greedy batches skip the hash and the logs
            xt = x
            if scaled:
                xt = x / temp
            w = _uniform(idx, k0, k1)
            if SCREEN > 0:
                bound = tl.where(sampled, xt + _gumbel_bound(w), x)  # >= z, rounding included
                may = bound > seen[:, None]
                if SCREEN == 2:
                    may &= bound >= floor
                if tl.max(tl.max(may.to(tl.int32), axis=1), axis=0) > 0:
                    z = tl.where(sampled, xt + _gumbel(w), x)
                    best, best_i = _keep_first_max(z, idx, best, best_i)
                    seen = tl.max(best, axis=1)  # best never holds NaN (NaN > b is false)
                    if SCREEN == 2:
                        tl.atomic_max(floor_ptr + rows, seen, mask=rmask, sem="relaxed")
            else:
                z = tl.where(sampled, xt + _gumbel(w), x)
                best, best_i = _keep_first_max(z, idx, best, best_i)
        else:
            best, best_i = _keep_first_max(x, idx, best, best_i)
    top = tl.max(best, axis=1)  # [R]
    top_i = tl.min(tl.where(best == top[:, None], best_i, 2147483647), axis=1)
    return top, top_i, tl.max(nan, axis=1) > 0


@triton.jit
def _store_winner(
    top, top_i, has_nan, pval_ptr, pidx_ptr, out_ptr, rows, rmask, n_chunks, SINGLE: tl.constexpr
):
    """SINGLE (the chunk is the whole row): the id (or -1 on NaN) to out_ptr, skipping pass 2."""
    if SINGLE:
        tl.store(out_ptr + rows, tl.where(has_nan, -1, top_i).to(tl.int64), mask=rmask)
    else:
        top = tl.where(has_nan, float("nan"), top)
        tl.store(pval_ptr + rows * n_chunks + tl.program_id(1), top, mask=rmask)
        tl.store(pidx_ptr + rows * n_chunks + tl.program_id(1), top_i, mask=rmask)


@triton.jit
def _sample_chunk_kernel(
    logits_ptr,
    stride_row,
    temp_ptr,
    seed_ptr,
    off_ptr,
    pval_ptr,
    pidx_ptr,
    out_ptr,
    B,
    V,
    n_chunks,
    ROWS: tl.constexpr,
    CHUNK,
    BLOCK: tl.constexpr,
    SINGLE: tl.constexpr,
    floor_ptr,
    SCREEN: tl.constexpr,
):
    """A [ROWS, CHUNK] tile in [ROWS, BLOCK] steps -> each row's (max z, first index) of the chunk."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # [R]
    rmask = rows < B
    rows = rows.to(tl.int64)
    top, top_i, has_nan = _chunk_winner(
        logits_ptr, stride_row, temp_ptr, seed_ptr, off_ptr, rows, rmask, V, 0.0, 0, CHUNK, BLOCK, floor_ptr,
        False, SCREEN,
    )  # fmt: skip
    _store_winner(top, top_i, has_nan, pval_ptr, pidx_ptr, out_ptr, rows, rmask, n_chunks, SINGLE)


@triton.jit
def _sample_chunk_cut_kernel(
    logits_ptr,
    stride_row,
    temp_ptr,
    seed_ptr,
    off_ptr,
    pval_ptr,
    pidx_ptr,
    out_ptr,
    B,
    V,
    n_chunks,
    tau_ptr,
    cut_ptr,
    ROWS: tl.constexpr,
    CHUNK,
    BLOCK: tl.constexpr,
    SINGLE: tl.constexpr,
    floor_ptr,
    SCREEN: tl.constexpr,
):
    """_sample_chunk_kernel with filter_cut's (tau, cut) applied as the rows are read."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # [R]
    rmask = rows < B
    rows = rows.to(tl.int64)
    tau = tl.load(tau_ptr + rows, mask=rmask, other=float("-inf"))[:, None]  # [R, 1]
    cut = tl.load(cut_ptr + rows, mask=rmask, other=-1)[:, None]
    top, top_i, has_nan = _chunk_winner(
        logits_ptr, stride_row, temp_ptr, seed_ptr, off_ptr, rows, rmask, V, tau, cut, CHUNK, BLOCK,
        floor_ptr, True, SCREEN,
    )  # fmt: skip
    _store_winner(top, top_i, has_nan, pval_ptr, pidx_ptr, out_ptr, rows, rmask, n_chunks, SINGLE)


@triton.jit
def _sample_reduce_kernel(pval_ptr, pidx_ptr, out_ptr, B, n_chunks, ROWS: tl.constexpr, CHUNKS: tl.constexpr):
    """Each row's chunk winners -> the largest z, first index on ties; -1 if a chunk saw NaN."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # [R]
    rmask = rows < B
    rows = rows.to(tl.int64)
    c = tl.arange(0, CHUNKS)[None, :]
    m = rmask[:, None] & (c < n_chunks)
    val = tl.load(pval_ptr + rows[:, None] * n_chunks + c, mask=m, other=float("-inf"))
    idx = tl.load(pidx_ptr + rows[:, None] * n_chunks + c, mask=m, other=2147483647)
    is_nan = val != val  # noqa: PLR0124 (NaN test)
    has_nan = tl.max(is_nan.to(tl.int32), axis=1) > 0
    val = tl.where(is_nan, float("-inf"), val)
    top = tl.max(val, axis=1)
    top_i = tl.min(tl.where(val == top[:, None], idx, 2147483647), axis=1)
    tl.store(out_ptr + rows, tl.where(has_nan, -1, top_i).to(tl.int64), mask=rmask)


def _chunk_size(b: int, v: int, most: int) -> int:
    """Aim for >= ~1000 programs (an H100 has 132 SMs), chunks of 2K..most elements."""
    return min(most, max(2048, triton.next_power_of_2(triton.cdiv(b * v, 1024))))


def screen_mode(rows: int, single: bool) -> int:
    """The SCREEN a launch of `rows` rows takes: 0 below SCREEN_FROM; mode 2 only where rows are
    split in chunks (a single chunk has no other chunk to share its best with)."""
    if rows < SCREEN_FROM:
        return 0
    return SCREEN if not single else min(SCREEN, 1)


def launch_shape(rows: int, cut: bool) -> tuple[int, int, int]:
    """(BLOCK, warps, chunk at most) of a draw launch of `rows` rows: SCREEN_*'s where it screens
    (screen_mode) and draws unfiltered, the unscreened shape otherwise."""
    if not cut and screen_mode(rows, single=True):  # its threshold, in one place; single: any mode > 0
        return SCREEN_BLOCK, SCREEN_WARPS, SCREEN_CHUNK_MAX
    return _BLOCK, WARPS, CHUNK_MAX


def gumbel_argmax(
    logits: Tensor,
    temperature: Tensor,
    seeds: Tensor,
    offsets: Tensor,
    cut: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """logits [B, V] float32 or bfloat16 (may hold -inf), temperature [B] (0 = greedy) -> ids [B]
    int64, -1 on NaN. bf16 logits widen to float32 exactly as they are read: the float32 copy's ids,
    from half the bytes. cut: filter_cut's (tau [B] float32, cut [B] int32), applied as rows are read."""
    B, V = logits.shape
    out = torch.empty(B, dtype=torch.int64, device=logits.device)
    if B == 0:
        return out
    block_most, warps, chunk_most = launch_shape(B, cut is not None)
    block = min(block_most, triton.next_power_of_2(V))
    chunk = min(_chunk_size(B, V, chunk_most), triton.next_power_of_2(V))  # >= block
    n_chunks = triton.cdiv(V, chunk)
    # Short rows share a program (a [rows, BLOCK] tile); the real vocabulary takes one row each.
    rows = min(max(1, block_most // block), triton.next_power_of_2(B))
    grid = (triton.cdiv(B, rows), n_chunks)
    single = n_chunks == 1
    pval = out if single else torch.empty(B, n_chunks, dtype=torch.float32, device=logits.device)
    pidx = out if single else torch.empty(B, n_chunks, dtype=torch.int32, device=logits.device)
    args = (logits, logits.stride(0), temperature, seeds, offsets, pval, pidx, out, B, V, n_chunks)
    # SCREEN 2 shares a row's best z across its chunks: a [B] -inf fill, for rows split in chunks.
    # Otherwise there is no floor_ptr (None: a constexpr the kernel never reads).
    screen = screen_mode(B, single)
    floor = torch.full((B,), float("-inf"), device=logits.device) if screen == 2 else None
    consts = dict(ROWS=rows, CHUNK=chunk, BLOCK=block, SINGLE=single, floor_ptr=floor, SCREEN=screen)
    if cut is None:
        _sample_chunk_kernel[grid](*args, **consts, num_warps=warps)
    else:
        _sample_chunk_cut_kernel[grid](*args, *cut, **consts, num_warps=warps)
    if not single:
        chunks = max(128, triton.next_power_of_2(n_chunks))  # 128 holds the vocabulary's 13-99 chunks
        rows = max(1, 256 // chunks)
        _sample_reduce_kernel[(triton.cdiv(B, rows),)](
            pval, pidx, out, B, n_chunks, ROWS=rows, CHUNKS=chunks, num_warps=1
        )
    return out

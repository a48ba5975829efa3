"""Decode projection y = x @ W^T + b for one or two tokens, with W read before the previous kernel ends.

Why. At batch 1 every projection is bound by memory latency, not bandwidth: linear.py's GEMV (a tl.dot
pipeline, each program a chain of 32 dependent K steps) moves the O weight (23.6 MB) in ~11.8 us on an
H200, 2 TB/s of ~4.3, and cuBLAS the QKV weight (29.5 MB) in ~10.2 us. Two things cost there: the
bytes in flight (a few stages a program) and the wait: a kernel's first load leaves only once the
kernel before it has finished (PDL's griddepcontrol.wait), so each projection starts with a DRAM
round trip and a ramp. But W never changes. Here a program loads its whole share of W, BN rows of the
whole K, into registers in one go, and only then waits for the previous kernel: with PDL the programs
that find room on the SMs beside that kernel (attention before O uses a few dozen programs at batch
1; the norm before QKV a few) stream their rows while it runs, and after the wait only x (from
L2), the sums and the store remain. Without PDL (GPTOSS_PDL=0, older GPUs, the interpreter) the same
code runs the loads after the previous kernel, as one wide burst of BN x K loads a program.

A program: rows [pid*BN, pid*BN + BN) of W and all of K, as one tile [BN, K1] plus, when K is not a
power of two, a second [BN, K2] for the rest (K 2880 = 2048 + 832 in a 1024 tile: 94 % of the
registers hold bytes, not 70 % for one 4096 tile). Each token's row of y is the float32 sum of the
products over K (tl.sum: a fixed tree per row, the same whatever T is, so rows do not depend on the
batch), plus the bias, rounded once. No tensor cores: at T <= MAX_T the FMAs are ~K per row a token.

Bytes: W (N*K*e), then T*K*e of x per program from L2 and T*N*e out. Registers hold BN*(K1+K2)*e per
program, so BN*K*e / (32 * num_warps) bytes a thread: 4 rows of O (K 4096, bf16) at 4 warps are 256
B a thread (64 registers).

Measured (H200, bench/results v31). Alone, 24 launches on distinct weights in a CUDA graph
(bench/kernels/linear_gpu.py), T 1: O 7.85 us (3.0 TB/s) against the tl.dot GEMV's 11.64, QKV 10.23
against cuBLAS's 10.56; at T 2 QKV loses (12.70 against 10.94), so linear() gives it one-token
steps only. In the engine (random 120b, batch-1 128 -> 512, one process each, vLLM 229.3 in the same
call): 351.0 tok/s at BN 2 x 4 warps against 341.6 (+2.8 %); 4 x 4 341.8, 8 x 8 323.8. The profile
(PDL on) says why the kernels' gain mostly does not reach the step: the projections add 501 us a
step against 788 (O GEMV + cuBLAS QKV), but the kernels they preload beside grow: attention +142 us,
the norms +77, the reduce +36. Their chains of dependent loads wait behind the streams of W.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

from gptoss.kernels import pdl
from gptoss.kernels.rounding import round_to

# The most tokens a launch takes: each program re-reads its T rows of x from L2 (K*e each, next to
# its BN*K*e of W) and does T times the FMAs on the same registers.
MAX_T = 2


def tiles_from_env(v: str | None, name: str = "GPTOSS_GEMV_PRELOAD_TILE") -> tuple[int, int]:
    """(BN, num_warps) from name="BN,WARPS" (unset or empty: 2, 4, the engine's best of 4,4 / 2,4 /
    8,8 at 120b batch 1 on an H200, bench/results v31)."""
    if v in (None, ""):
        return 2, 4
    parts = v.split(",")
    ok = len(parts) == 2 and all(p.isdigit() and int(p) > 0 and not int(p) & (int(p) - 1) for p in parts)
    if not ok:
        raise ValueError(f"{name} must be BN,WARPS (two powers of two), got {v!r}")
    return int(parts[0]), int(parts[1])


TILE = tiles_from_env(os.environ.get("GPTOSS_GEMV_PRELOAD_TILE"))


def early_from_env(v: str | None) -> int | None:
    """GPTOSS_GEMV_PRELOAD_EARLY: how many of a program's BN rows of W load before the PDL wait, for
    A/B runs of the overlap against the contention it puts on the kernel before (bench/results
    v31): unset or "all" every row (None), 0 none (W after the wait, as one wide burst), N the first
    N (at most BN)."""
    if v in (None, "", "all"):
        return None
    if not v.isdigit():
        raise ValueError(f"GPTOSS_GEMV_PRELOAD_EARLY must be all or a row count, got {v!r}")
    return int(v)


EARLY = early_from_env(os.environ.get("GPTOSS_GEMV_PRELOAD_EARLY"))


def k_parts(k: int) -> tuple[int, int]:
    """(K1, K2): K1 the largest power of two <= k, K2 the next power of two >= the rest (0: none)."""
    if k < 1:
        raise ValueError(f"K must be positive, got {k}")
    k1 = 1 << (k.bit_length() - 1)
    return k1, (triton.next_power_of_2(k - k1) if k > k1 else 0)


@triton.jit
def _x_row(x_ptr, K, K1: tl.constexpr, K2: tl.constexpr, live):
    """x [K] as float32 tiles [K1], [K2] (zeros where not live: the second token of a one-token launch)."""
    k1 = tl.arange(0, K1)
    x1 = tl.load(x_ptr + k1, mask=live, other=0.0).to(tl.float32)
    x2 = x1
    if K2 > 0:
        k2 = K1 + tl.arange(0, K2)
        x2 = tl.load(x_ptr + k2, mask=live & (k2 < K), other=0.0).to(tl.float32)
    return x1, x2


@triton.jit
def _sums(w1, w2, x1, x2, K2: tl.constexpr):
    """[BN] float32: each row of the tiles [BN, K1] (+ [BN, K2] at K1..K) times x (_x_row's tiles).
    The one definition of a row's sum: gemv_stream's rows are these bits."""
    acc = tl.sum(w1.to(tl.float32) * x1[None, :], axis=1)
    if K2 > 0:
        acc += tl.sum(w2.to(tl.float32) * x2[None, :], axis=1)
    return acc


@triton.jit
def _row_sums(w1, w2, x_ptr, K, K1: tl.constexpr, K2: tl.constexpr):
    """[BN] float32: _sums of the tiles with the row of x at x_ptr."""
    x1, x2 = _x_row(x_ptr, K, K1, K2, True)
    return _sums(w1, w2, x1, x2, K2)


@triton.jit(do_not_specialize=["T"])
def _gemv_preload_kernel(
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
    EARLY: tl.constexpr,
    PDL: tl.constexpr,
):
    """EARLY: rows of the program's BN whose W loads leave before the PDL wait (BN: all, 0: none)."""
    if EARLY == 0:
        pdl.wait_then_release(PDL)
    rows = tl.program_id(0) * BN + tl.arange(0, BN)  # [BN]
    # Rows past N are clamped, not masked: W's loads carry only the K mask; the store drops them.
    w_rows = w_ptr + tl.minimum(rows, N - 1).to(tl.int64)[:, None] * stride_w  # [BN, 1]
    kk1 = tl.arange(0, K1)[None, :]
    kk2 = K1 + tl.arange(0, max(K2, 1))[None, :]
    if EARLY == BN or EARLY == 0:
        w1 = tl.load(w_rows + kk1)  # [BN, K1]
        w2 = w1  # unused unless K2 > 0
        if K2 > 0:
            w2 = tl.load(w_rows + kk2, mask=kk2 < K, other=0.0)  # [BN, K2]
    else:  # the first EARLY rows now, the rest after the wait
        early = (tl.arange(0, BN) < EARLY)[:, None]
        w1 = tl.load(w_rows + kk1, mask=early, other=0.0)
        w2 = w1
        if K2 > 0:
            w2 = tl.load(w_rows + kk2, mask=early & (kk2 < K), other=0.0)
    # W and the bias are never written, so their loads may leave before the previous kernel's writes
    # are visible; x and y wait for them. (The bias after the wait made its DRAM trip, not x's L2
    # one, the round trip between the wait and the sums.)
    bias = tl.zeros((BN,), dtype=tl.float32)
    if HAS_BIAS:
        bias = tl.load(b_ptr + tl.minimum(rows, N - 1)).to(tl.float32)
    if EARLY > 0:
        pdl.wait_then_release(PDL)
    if EARLY > 0 and EARLY < BN:
        w1 = tl.where(early, w1, tl.load(w_rows + kk1, mask=~early, other=0.0))
        if K2 > 0:
            w2 = tl.where(early, w2, tl.load(w_rows + kk2, mask=~early & (kk2 < K), other=0.0))
    for t in range(T):
        acc = _row_sums(w1, w2, x_ptr + t * stride_x, K, K1, K2) + bias
        tl.store(y_ptr + t * stride_y + rows, round_to(acc, y_ptr.dtype.element_ty), mask=rows < N)


def plain_operands(x: Tensor, w: Tensor, b: Tensor | None) -> bool:
    """What both decode GEMVs (this one and linear.gemv) need of their operands: x 2-D, x's and W's
    last dim contiguous, one float dtype for x, W and a contiguous b."""
    return (
        x.dim() == 2
        and x.stride(1) == 1
        and w.stride(1) == 1
        and x.dtype == w.dtype
        and x.dtype in (torch.bfloat16, torch.float16, torch.float32)
        and (b is None or (b.dtype == x.dtype and b.is_contiguous()))
    )


def suits(x: Tensor, w: Tensor, b: Tensor | None) -> bool:
    """Whether gemv_preload takes x [T, K] (1 <= T <= MAX_T) and w [N, K] as they stand."""
    return (
        plain_operands(x, w, b)
        and w.dim() == 2
        and 1 <= x.shape[0] <= MAX_T
        and x.shape[1] == w.shape[1]
        and (b is None or b.shape == (w.shape[0],))
    )


def checked_output(name: str, x: Tensor, w: Tensor, b: Tensor | None) -> tuple[int, int, int, Tensor]:
    """(T, K, N, y [T, N] empty) for a decode GEMV `name` that takes what `suits` takes, or a clear
    error naming the operands."""
    if not suits(x, w, b):
        raise ValueError(
            f"{name} needs x [T, K] with 1 <= T <= {MAX_T}, w [N, K] and b [N] | None of one dtype "
            f"and a contiguous last dim, got x {tuple(x.shape)} {x.dtype} strides {x.stride()}, "
            f"w {tuple(w.shape)} {w.dtype}, b {None if b is None else (tuple(b.shape), b.dtype)}"
        )
    (t, k), n = x.shape, w.shape[0]
    return t, k, n, torch.empty(t, n, dtype=x.dtype, device=x.device)


def gemv_preload(
    x: Tensor,
    w: Tensor,
    b: Tensor | None = None,
    *,
    block_n: int | None = None,
    num_warps: int | None = None,
    early_rows: int | None = None,
) -> Tensor:
    """x [T, K], w [N, K], b [N] | None -> y [T, N] = x @ w^T + b, T <= MAX_T; tiles default to TILE,
    early_rows (the rows of a program's BN loaded before the PDL wait) to EARLY, both all BN rows."""
    t, k, n, y = checked_output("gemv_preload", x, w, b)
    if n == 0:
        return y
    bn, warps = block_n or TILE[0], num_warps or TILE[1]
    k1, k2 = k_parts(k)
    early = EARLY if early_rows is None else early_rows
    _gemv_preload_kernel[(triton.cdiv(n, bn),)](
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
        EARLY=min(bn, bn if early is None else early),
        num_warps=warps,
        num_stages=1,
        **pdl.args(x),
    )
    return y

"""Dense projection y = x @ W^T + b for a few tokens (decode), streaming W at HBM bandwidth.

x [T, K], W [N, K] row-major as stored, b [N] | None -> y [T, N], all one dtype (bf16 in the
engine), float32 accumulation. Bytes moved: N*K*e for W (the whole cost), plus T*K*e per program
for x (from L2) and T*N*e + N*e; FLOPs 2*T*N*K. gpt-oss's QKV [5120, 2880] and O [2880, 4096]
weights are 29.5 and 23.6 MB a layer.

cuBLAS runs these as GEMMs with 64+ rows of x, mostly padding at T = 1..8, and splits K for O with
a separate reduce kernel. Here the GEMM is swapped: each program computes a [BN, TB] tile of y^T =
W @ x^T, so W's rows are the MMA's M side and the few tokens its N side (padded to 16, tl.dot's
least; padding rows of x are masked loads, so they move no bytes). A program owns BN rows of W and
the whole of K: no reduction crosses programs (deterministic, no second launch), and all programs
are resident at once on an H100, so there is no wave tail. The K loop is a plain tl.dot loop, so
Triton's pipeliner streams W through shared memory with 16-byte cp.async (LDGSTS.128), num_stages
deep, and the tensor cores leave the SM's issue slots to the loads (sm_90a SASS of the K loop at
BN 32, BK 256: 124 instructions per thread per step of 64 weight elements a thread, no spills).

A token's row of y does not depend on how many other tokens share the launch (the block sizes come
from N and K only, and the MMA sums each column of y^T on its own), so decode is batch-invariant in
these projections. In the interpreter, bf16 operands are upcast before tl.dot (Triton 3.6's
interpreter multiplies their raw bits); products of bf16 values are exact in float32 either way.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from gptoss.kernels import device_info, pdl
from gptoss.kernels.gemv_preload import gemv_preload, plain_operands
from gptoss.kernels.gemv_preload import suits as preload_suits
from gptoss.kernels.gemv_stream import gemv_stream
from gptoss.kernels.rounding import round_to

# linear() hands larger T to F.linear: every program re-reads its T rows of x from L2, which at
# T = 16 is half of W's bytes again (QKV, BN 32), and cuBLAS's GEMM tiles stop being mostly padding.
# bench/kernels/linear_gpu.py times T = 16 too: raise this if ours still wins there.
GEMV_MAX_T = 8


def gemv_from_env(v: str | None) -> str:
    """GPTOSS_GEMV: "stream" (unset), "preload" or "dot"."""
    v = v or "stream"
    if v not in ("dot", "preload", "stream"):
        raise ValueError(f"GPTOSS_GEMV={v!r}: dot, preload or stream")
    return v


# GPTOSS_GEMV picks the CUDA decode projections' kernel:
#   dot      T <= GEMV_MAX_T on the tl.dot GEMV below where W is wider than tall (O), else cuBLAS (QKV)
#   preload  one token on gemv_preload, QKV and O alike (W read before the PDL wait), and up to
#            gemv_preload.MAX_T for a wide W (O; a tall one, QKV, lost to cuBLAS at T 2); larger T
#            as with dot. H200, 120b batch 1: 351.0 against 341.6 tok/s (bench/results v31)
#   stream   (the default) where preload would run, gemv_stream: the same sums on a one-wave grid
#            whose programs walk several row blocks, the next block in flight (its docstring has
#            the H200 figures, v40: 120b batch 1 +1.5 to +2.2 % over preload)
GEMV = gemv_from_env(os.environ.get("GPTOSS_GEMV"))


@triton.jit
def _gemv_kernel(
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
    TB: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl.wait_then_release(PDL)
    # Token blocks vary fastest, so the programs that share a block of W run together and all but
    # the first read it from L2 (more than one token block: batch-invariant mode's larger T).
    pid_t = tl.program_id(0)
    pid = tl.program_id(1)
    rows = pid * BN + tl.arange(0, BN)  # [BN]
    toks = pid_t * TB + tl.arange(0, TB)  # [TB]
    kk = tl.arange(0, BK)  # [BK]
    # Rows past N are clamped rather than masked, so W's loads carry only the K mask (none when
    # BK divides K); their results are dropped at the store.
    safe_rows = tl.minimum(rows, N - 1).to(tl.int64)
    w_base = w_ptr + safe_rows[:, None] * stride_w + kk[None, :]  # [BN, BK]
    xt_base = x_ptr + toks[None, :].to(tl.int64) * stride_x + kk[:, None]  # [BK, TB]: x^T
    tok_ok = toks[None, :] < T
    acc = tl.zeros((BN, TB), dtype=tl.float32)  # y^T tile
    for k0 in range(0, K, BK):
        k_ok = (k0 + kk) < K  # [BK]
        w = tl.load(w_base + k0, mask=k_ok[None, :], other=0.0)  # [BN, BK]
        # Padding tokens are masked: no bytes move for them (a zero fill).
        xt = tl.load(xt_base + k0, mask=tok_ok & k_ok[:, None], other=0.0)  # [BK, TB]
        if UPCAST:
            acc = tl.dot(w.to(tl.float32), xt.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(w, xt, acc, input_precision=PRECISION)
    if HAS_BIAS:
        acc += tl.load(b_ptr + safe_rows).to(tl.float32)[:, None]
    y_off = toks[None, :].to(tl.int64) * stride_y + rows[:, None]  # [BN, TB]
    mask = tok_ok & (rows[:, None] < N)
    tl.store(y_ptr + y_off, round_to(acc, y_ptr.dtype.element_ty), mask=mask)


def block_sizes(n: int, k: int, device: torch.device) -> tuple[int, int, int, int]:
    """(BN, BK, num_warps, num_stages) for W [n, k]: BN 32, BK 128, 4 warps, 6 stages, the best of
    the sweep on the H100 (bench/results 2026-11-22 v7: O [2880, 4096] 12.3 us a layer at T 1-16,
    1.92 TB/s, against 13.7-14.2 for the BK 256 tiles and 14.3 for cuBLAS with its split-K reduce).
    90 programs for O: a stage is W's [32, 128] and x's [128, 16] tiles (12 KB), 5 in flight, so
    ~60 KB of W in flight a program. device is unused: the sweep found no better tile by SM count."""
    del device
    return 32, max(16, min(128, triton.next_power_of_2(k))), 4, 6


def stages_that_fit(stages: int, stage_bytes: int, max_shared: int) -> int:
    """The most of `stages` whose buffers fit max_shared bytes. Triton's pipeliner keeps stages - 1
    of them (W's [BN, BK] and x's [BK, TB] tiles a stage): a float32 gemv at TB 64 and 6 stages asked
    for 5 x 48 KB = 245,760 bytes and did not launch on an H100 (232,448; bench/results v72). Fewer
    stages change no sum's order, so the bits and the batch invariance stay."""
    return max(1, min(stages, 1 + max_shared // stage_bytes))


def gemv(
    x: Tensor,
    w: Tensor,
    b: Tensor | None = None,
    *,
    block_n: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    token_block: int | None = None,
) -> Tensor:
    """x [T, K], w [N, K], b [N] | None -> y [T, N] on the Triton kernel, whatever T is (the bench
    times T past GEMV_MAX_T through this). Block sizes default to `block_sizes`. token_block: tokens
    per program (a power of two >= 16), the launch then tiling T; by default one block of T's next
    power of two. With a fixed token_block, every row's instructions are the same whatever T is."""
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"need x [T, K] and w [N, K], got {tuple(x.shape)} and {tuple(w.shape)}")
    if x.stride(1) != 1 or w.stride(1) != 1:
        raise ValueError(f"x and w need a contiguous last dim, got strides {x.stride()} and {w.stride()}")
    if w.dtype != x.dtype or (b is not None and b.dtype != x.dtype):
        raise ValueError(
            f"x, w, b must share a dtype, got {x.dtype}, {w.dtype}, {None if b is None else b.dtype}"
        )
    T, K = x.shape
    N = w.shape[0]
    if b is not None and (b.shape != (N,) or not b.is_contiguous()):
        raise ValueError(f"b must be a contiguous [{N}], got {tuple(b.shape)}")
    y = torch.empty(T, N, dtype=x.dtype, device=x.device)  # [T, N]
    if T == 0 or N == 0:
        return y
    bn, bk, warps, stages = block_sizes(N, K, x.device)
    bn, bk = block_n or bn, block_k or bk
    warps, stages = num_warps or warps, num_stages or stages
    if token_block is not None and (token_block < 16 or token_block & (token_block - 1)):
        raise ValueError(f"token_block must be a power of two >= 16, got {token_block}")
    tb = token_block or max(16, triton.next_power_of_2(T))  # tl.dot's least N is 16
    if x.is_cuda:
        stages = stages_that_fit(stages, (bn + tb) * bk * x.element_size(), device_info.max_shared_mem(x))
    _gemv_kernel[(triton.cdiv(T, tb), triton.cdiv(N, bn))](
        x,
        w,
        b if b is not None else w,
        y,
        T,
        N,
        K,
        x.stride(0),
        w.stride(0),
        y.stride(0),
        HAS_BIAS=b is not None,
        TB=tb,
        BN=bn,
        BK=bk,
        # float32 engines (tests) get exact products, not tf32's 10-bit mantissas.
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        UPCAST=bool(triton.knobs.runtime.interpret),
        num_warps=warps,
        num_stages=stages,
        **pdl.args(x),
    )
    return y


def linear(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    """F.linear(x, w, b). With GPTOSS_GEMV=stream (the default), a CUDA x of one token, or of up to
    gemv_preload.MAX_T for a wide W, takes gemv_stream (GPTOSS_GEMV=preload: gemv_preload). Else the
    GEMV kernel takes a CUDA [T, K] with 1 <= T <= GEMV_MAX_T when W is wider than tall (K > N: where
    cuBLAS splits K and adds a reduce kernel) and the operands suit it; otherwise F.linear itself.
    Measured on the H100 (v7): O [2880, 4096] 12.3 vs 14.3 us, but QKV [5120, 2880] 14.3 vs 13.7 us,
    so QKV stays on cuBLAS there. CPU tensors always take F.linear, also under TRITON_INTERPRET=1:
    the interpreter runs a program in milliseconds, and the CPU engine tests would pay that on every
    projection (tests call the kernels directly)."""
    one_or_wide = x.dim() == 2 and (x.shape[0] == 1 or w.shape[1] > w.shape[0])
    if GEMV in ("preload", "stream") and x.is_cuda and one_or_wide and preload_suits(x, w, b):
        return gemv_stream(x, w, b) if GEMV == "stream" else gemv_preload(x, w, b)
    suits = (
        x.is_cuda and plain_operands(x, w, b) and 1 <= x.shape[0] <= GEMV_MAX_T and w.shape[1] > w.shape[0]
    )
    return gemv(x, w, b) if suits else F.linear(x, w, b)

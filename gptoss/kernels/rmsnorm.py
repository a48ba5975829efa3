"""Fused residual add + RMSNorm: r = residual + x; out = rms_norm(r) in float32, one row per program.

x, residual, out, r [T, H] (bf16 or float32, last dim contiguous); weight [H] float32. With
`combine` (the MoE's per-token expert weights [T, k]), x is the experts' unreduced output y [T*k, H]
and the kernel first forms x[t] = sum_j w[t, j] * y[t*k + j] in float32, rounded to y's dtype, as
gptoss.kernels.moe.combine would: one launch fewer a layer at decode, the same numbers. With `rows`
(token ids [T]) and no residual, x is the embedding table and row t of the input is x[rows[t]]: the
first layer's norm gathers its rows itself and stores them as r, where F.embedding was a launch of
its own (6.3 us a token at 120b's batch 1 on an H200, v40's profile), the same bits.
Bytes moved: T*H*e*(2 + 2*has_residual) + 4*H (e = element size), i.e. at H = 2880 in bf16 with a
residual 23 KB per token. No FLOP worth counting: the op is bound by memory bandwidth.

Numerics follow `gptoss.model.rms_norm` step by step: r rounds to x.dtype exactly as torch's add
does (float32 sum, one rounding), then xf * rsqrt(mean(xf^2) + eps), then weight * that, then one
rounding to x.dtype. Only the order of the sum of squares differs (a tree, not torch's), so float32
outputs agree to ~1 ulp of the rsqrt (about 1e-7 relative) and bf16 outputs are exact or 1 bf16 ulp
off where that tiny difference straddles a rounding boundary.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from gptoss.kernels import pdl
from gptoss.kernels.rounding import round_to

# Warps a row from LARGE_T tokens on (None: the same launch at every T). One row a program of 16
# warps (H 2880) gives batch 1 its latency, but from a thousand rows on the programs run in waves (4
# of 512 threads an SM), each a load, a cross-warp sum and a store. bench/kernels/rmsnorm_gpu.py on
# an H200 (v67), us at T 512 / 1024 / 2048 / 4096 / 8192: 16 warps 3.8 / 7.0 / 13.7 / 27.8 / 53.4,
# 8 warps 4.1 / 6.2 / 12.5 / 26.2 / 49.8, 4 warps 4.4 / 6.0 / 12.5 / 25.3 / 48.6, 2 warps 4.1 / 7.8
# / 22.8 / 49.1 / 95.4; up to 256 rows 16, 8 and 4 warps alike. The sum's order follows the warps,
# so a row's last bit may move with T (up to 1 % of rows one bf16 step): batch-invariant callers ask
# for the launch of T 1 at every T.
LARGE_T: int | None = 1024
LARGE_WARPS = 4


def num_warps(T: int, block: int, batch_invariant: bool = False) -> int:
    """The launch's warps for T rows of a BLOCK-wide row: 16 at H 2880 (one warp a 256 wide slice),
    LARGE_WARPS at most from LARGE_T rows on, unless batch_invariant."""
    # At 120b's batch 1 (H200, v38) 4 warps added 228 us a token against 130, 32 the same 131: the
    # per-thread chain of loads and sums sets a lone row's latency.
    warps = min(16, max(1, block // 256))
    if LARGE_T is not None and T >= LARGE_T and not batch_invariant:
        warps = min(warps, LARGE_WARPS)
    return warps


@triton.jit
def combine_rows(y_ptr, w_ptr, t, cols, mask, stride_y, TOP_K: tl.constexpr, BLOCK: tl.constexpr):
    """sum_j w[t, j] * y[t*k + j, cols] in float32, in slot order: the MoE combine's one definition
    (moe._combine_kernel and the combine= path here), so both give the same bits."""
    acc = tl.zeros([BLOCK], tl.float32)
    for j in tl.static_range(TOP_K):
        wj = tl.load(w_ptr + t * TOP_K + j)
        acc += wj * tl.load(y_ptr + (t * TOP_K + j) * stride_y + cols, mask=mask, other=0.0).to(tl.float32)
    return acc


@triton.jit
def _rmsnorm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    r_ptr,
    cw_ptr,
    stride_x,
    stride_res,
    stride_out,
    stride_r,
    H,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    TOP_K: tl.constexpr,  # 0: x is the input; k: x = combine of y rows t*k .. t*k + k - 1 with cw
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
    ids_ptr=None,
    GATHER: tl.constexpr = False,  # x row ids_ptr[row] (no residual), stored as r
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    # The norm weight never changes: loaded before the PDL wait, its DRAM trip overlaps the kernel
    # before. Loaded after the sum (where it is used), it was a second round trip after the first,
    # as the compiler keeps a load below the stores to r (sm_90a SASS: 16 LDG after the MUFU).
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    pdl.wait_then_release(PDL)
    if GATHER:
        x = tl.load(x_ptr + tl.load(ids_ptr + row) * stride_x + cols, mask=mask, other=0.0)
        tl.store(r_ptr + row * stride_r + cols, x, mask=mask)
    elif TOP_K == 0:
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    else:  # moe.combine's sum (the same helper), rounded as it rounds
        x = combine_rows(x_ptr, cw_ptr, row, cols, mask, stride_x, TOP_K, BLOCK).to(x_ptr.dtype.element_ty)
    if HAS_RESIDUAL:
        res = tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0)
        # torch's bf16 add: exact float32 sum, one rounding to the storage dtype.
        x = round_to(x.to(tl.float32) + res.to(tl.float32), r_ptr.dtype.element_ty)
        tl.store(r_ptr + row * stride_r + cols, x, mask=mask)
    xf = x.to(tl.float32)
    mean_sq = tl.sum(xf * xf, axis=0) / H
    # 1/sqrt_rn rather than the approximate rsqrt instruction: one scalar per row, closer to torch.
    rstd = 1.0 / tl.sqrt_rn(mean_sq + eps)
    y = w * (xf * rstd)
    tl.store(out_ptr + row * stride_out + cols, round_to(y, out_ptr.dtype.element_ty), mask=mask)


def fused_add_rms_norm(
    x: Tensor,
    residual: Tensor | None,
    weight: Tensor,
    eps: float,
    combine: Tensor | None = None,
    rows: Tensor | None = None,
    batch_invariant: bool = False,
) -> tuple[Tensor, Tensor]:
    """x [T, H], residual [T, H] | None, weight [H] float32 -> (out [T, H], r [T, H]).

    With a residual, r = residual + x (a new tensor) and out = rms_norm(r); without, r is x itself.
    With combine [T, k] float32 (needs a residual), x is the MoE's y [T*k, H], combined first.
    With rows [T] int64 (no residual, no combine), x is an embedding table [V, H] and the input is
    F.embedding(rows, x), which r holds (a new tensor); the ids must lie in [0, V) (the engine's
    check_prompt and its sampler keep them there). batch_invariant: the launch of T 1 at every T, so
    a row's bits do not depend on the rows beside it (num_warps).
    """
    if rows is not None and (
        residual is not None or combine is not None or rows.dim() != 1 or rows.dtype != torch.int64
    ):
        raise ValueError(
            f"rows must be int64 [T], with no residual or combine, got rows {tuple(rows.shape)} {rows.dtype}"
        )
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(
            f"x must be [T, H] with a contiguous last dim, got {tuple(x.shape)} strides {x.stride()}"
        )
    top_k = 0
    if combine is not None:
        if residual is None or combine.dim() != 2 or combine.shape[0] * combine.shape[1] != x.shape[0]:
            raise ValueError(
                f"combine weights {tuple(combine.shape)} need a residual and x of [T*k, H] rows, "
                f"got x {tuple(x.shape)}"
            )
        top_k = combine.shape[1]
        combine = combine.contiguous()
    T, H = (x.shape[0] // max(top_k, 1) if rows is None else rows.shape[0], x.shape[1])
    if weight.shape != (H,) or not weight.is_contiguous():
        raise ValueError(f"weight must be a contiguous [{H}], got {tuple(weight.shape)}")
    if residual is not None and (
        residual.shape != (T, H) or residual.dtype != x.dtype or residual.stride(-1) != 1
    ):
        raise ValueError(
            f"residual must match x ({(T, H)}, {x.dtype}), got {tuple(residual.shape)}, {residual.dtype}"
        )
    out = x.new_empty(T, H)  # [T, H]
    r = x.new_empty(T, H) if residual is not None or rows is not None else x  # [T, H]
    if T == 0:
        return out, r
    block = triton.next_power_of_2(H)
    _rmsnorm_kernel[(T,)](
        x,
        residual if residual is not None else x,
        weight,
        out,
        r,
        combine if combine is not None else weight,
        x.stride(0),
        (residual if residual is not None else x).stride(0),
        out.stride(0),
        r.stride(0),
        H,
        eps,
        HAS_RESIDUAL=residual is not None,
        TOP_K=top_k,
        BLOCK=block,
        num_warps=num_warps(T, block, batch_invariant),
        **pdl.args(x),
        ids_ptr=None if rows is None else rows.contiguous(),
        GATHER=rows is not None,
    )
    return out, r

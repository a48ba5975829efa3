"""Fused residual add + RMSNorm: r = residual + x; out = rms_norm(r) in float32, one row per program.

x, residual, out, r [T, H] (bf16 or float32, last dim contiguous); weight [H] float32.
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

from gptoss.kernels.rounding import round_to


@triton.jit
def _rmsnorm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    r_ptr,
    stride_x,
    stride_res,
    stride_out,
    stride_r,
    H,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        res = tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0)
        # torch's bf16 add: exact float32 sum, one rounding to the storage dtype.
        x = round_to(x.to(tl.float32) + res.to(tl.float32), r_ptr.dtype.element_ty)
        tl.store(r_ptr + row * stride_r + cols, x, mask=mask)
    xf = x.to(tl.float32)
    mean_sq = tl.sum(xf * xf, axis=0) / H
    # 1/sqrt_rn rather than the approximate rsqrt instruction: one scalar per row, closer to torch.
    rstd = 1.0 / tl.sqrt_rn(mean_sq + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    y = w * (xf * rstd)
    tl.store(out_ptr + row * stride_out + cols, round_to(y, out_ptr.dtype.element_ty), mask=mask)


def fused_add_rms_norm(
    x: Tensor, residual: Tensor | None, weight: Tensor, eps: float
) -> tuple[Tensor, Tensor]:
    """x [T, H], residual [T, H] | None, weight [H] float32 -> (out [T, H], r [T, H]).

    With a residual, r = residual + x (a new tensor) and out = rms_norm(r); without, r is x itself.
    """
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(
            f"x must be [T, H] with a contiguous last dim, got {tuple(x.shape)} strides {x.stride()}"
        )
    T, H = x.shape
    if weight.shape != (H,) or not weight.is_contiguous():
        raise ValueError(f"weight must be a contiguous [{H}], got {tuple(weight.shape)}")
    if residual is not None and (
        residual.shape != x.shape or residual.dtype != x.dtype or residual.stride(-1) != 1
    ):
        raise ValueError(
            f"residual must match x ({tuple(x.shape)}, {x.dtype}), got "
            f"{tuple(residual.shape)}, {residual.dtype}"
        )
    out = torch.empty_like(x)  # [T, H]
    r = torch.empty_like(x) if residual is not None else x  # [T, H]
    if T == 0:
        return out, r
    block = triton.next_power_of_2(H)
    _rmsnorm_kernel[(T,)](
        x,
        residual if residual is not None else x,
        weight,
        out,
        r,
        x.stride(0),
        (residual if residual is not None else x).stride(0),
        out.stride(0),
        r.stride(0),
        H,
        eps,
        HAS_RESIDUAL=residual is not None,
        BLOCK=block,
        num_warps=min(16, max(1, block // 256)),
    )
    return out, r

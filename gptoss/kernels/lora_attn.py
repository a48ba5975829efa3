"""Decode (T <= 16): an attention projection's LoRA delta in one launch, added in place.

lora_add(out, x, A, B, mask) does out += ((x @ A^T) * mask) @ B^T, what the torch path does in three
launches (cuBLAS's shrink, the mask's multiply, cuBLAS's addmm); at concurrency 16 those were ~0.4 ms
of an ~8 ms step on an H100 (q/k/v and o, 24 layers). A program owns BN columns of out: it computes the
whole shrink u = x @ A^T [T, W] itself (x and A are small and come from L2: 16 x 2880 and W x 2880),
masks it, and expands u @ B[cols]^T into its columns. The shrink is repeated in every program
instead of a second launch: at W <= 128 that is ~0.4 MB of L2 reads a program.

The stacked q/k/v pair has A [3W, in] (q's, k's, v's adapters) and a block-diagonal B, and the
token mask [T, W] repeats over the three: column w takes mask[:, w % W].

In Triton 3.6's interpreter the dots take float32 operands (its bf16 dot multiplies raw bits).
Numerics are the torch path's: the shrink's float32 sums rounded to x.dtype (F.linear's output),
the 0/1 mask exact, then the expand's float32 sums added to out in float32 and rounded once (addmm).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from gptoss.kernels import pdl
from gptoss.kernels.rounding import round_to, rounded

MAX_T = 16  # decode sizes; past it cuBLAS's GEMMs win and the repeated shrink grows
MAX_W = 128  # u [16, W] stays in registers; wider stacks (many adapters, rank 64 q/k/v) take torch
BN, BK, WARPS = 64, 128, 4
# fused (default) | torch: the three launches, for A/B timing
MODE = os.environ.get("GPTOSS_ATTN_LORA", "fused")


@triton.jit
def _lora_add_kernel(
    x_ptr,
    a_ptr,
    b_ptr,
    m_ptr,
    out_ptr,
    T,
    K,
    N,
    W,
    MW,
    stride_x,
    stride_a,
    stride_b,
    stride_m,
    stride_out,
    TB: tl.constexpr,
    WB: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    PREC: tl.constexpr,
    UPCAST: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl.wait_then_release(PDL)
    dtype = x_ptr.dtype.element_ty
    rt = tl.arange(0, TB)
    rw = tl.arange(0, WB)
    rk = tl.arange(0, BK)
    t_ok = rt < T
    w_ok = rw < W
    u = tl.zeros((TB, WB), tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + rk
        k_ok = k < K
        xs = tl.load(
            x_ptr + rt[:, None] * stride_x + k[None, :], mask=t_ok[:, None] & k_ok[None, :], other=0.0
        )
        at = tl.load(
            a_ptr + rw[None, :] * stride_a + k[:, None], mask=w_ok[None, :] & k_ok[:, None], other=0.0
        )
        if UPCAST:  # products of bf16 values are exact in float32 either way
            u = tl.dot(xs.to(tl.float32), at.to(tl.float32), u, input_precision="ieee")
        else:
            u = tl.dot(xs, at, u, input_precision=PREC)  # [TB, WB]
    m = tl.load(
        m_ptr + rt[:, None] * stride_m + (rw % MW)[None, :], mask=t_ok[:, None] & w_ok[None, :], other=0.0
    )
    u = rounded(u, dtype) * m.to(tl.float32)  # F.linear's rounding, the exact 0/1 mask
    cols = tl.program_id(0) * BN + tl.arange(0, BN)
    n_ok = cols < N
    bt = tl.load(
        b_ptr + cols[None, :] * stride_b + rw[:, None], mask=n_ok[None, :] & w_ok[:, None], other=0.0
    )
    if UPCAST:
        delta = tl.dot(u, bt.to(tl.float32), input_precision="ieee")  # [TB, BN]
    else:
        delta = tl.dot(u.to(dtype), bt, input_precision=PREC)
    o_ptrs = out_ptr + rt[:, None] * stride_out + cols[None, :]
    o_ok = t_ok[:, None] & n_ok[None, :]
    o = tl.load(o_ptrs, mask=o_ok, other=0.0).to(tl.float32)
    tl.store(o_ptrs, round_to(o + delta, dtype), mask=o_ok)


def suits(x: Tensor, a: Tensor) -> bool:
    """Whether lora_add runs the fused kernel for these sizes (else the torch path)."""
    return MODE == "fused" and x.shape[0] <= MAX_T and a.shape[0] <= MAX_W


def lora_add(out: Tensor, x: Tensor, a: Tensor, b: Tensor, mask: Tensor, *, fused: bool = True) -> None:
    """out [T, N] += ((x [T, K] @ a [W', K]^T) * mask') @ b [N, W']^T, in place; mask [T, W] with W'
    a multiple of W (the stacked q/k/v: mask repeated). fused=False: the torch path at every size
    (batch-invariant mode: a row's sums must not change with the batch's size)."""
    t, k = x.shape
    w, n = a.shape[0], out.shape[1]
    if w % mask.shape[1]:
        raise ValueError(f"LoRA width {w} is not a multiple of the mask's {mask.shape[1]}")
    if t == 0:
        return
    if out.stride(1) != 1 or not (a.is_contiguous() and b.is_contiguous()):
        raise ValueError("lora_add needs out's rows, A and B contiguous")
    if not (fused and suits(x, a)) or not (x.is_cuda or triton.knobs.runtime.interpret):
        reps = w // mask.shape[1]
        out.addmm_(F.linear(x, a) * (mask if reps == 1 else mask.repeat(1, reps)), b.t())
        return
    x, mask = x.contiguous(), mask.contiguous()
    fp32 = x.dtype == torch.float32
    _lora_add_kernel[(triton.cdiv(n, BN),)](
        x,
        a,
        b,
        mask,
        out,
        t,
        k,
        n,
        w,
        mask.shape[1],
        x.stride(0),
        a.stride(0),
        b.stride(0),
        mask.stride(0),
        out.stride(0),
        TB=16,
        WB=max(16, triton.next_power_of_2(w)),
        BN=BN,
        BK=BK,
        PREC="ieee" if fp32 else "tf32",
        UPCAST=bool(triton.knobs.runtime.interpret),  # its dot multiplies bf16 operands' raw bits
        num_warps=WARPS,
        **pdl.args(x),
    )

"""Decode (T <= 16): residual add + RMSNorm, the router GEMM and the routing in one launch of one program.

norm_route(x, residual, ln2, eps, W, b, k) = (h, r, Routing) of

  h, r   = fused_add_rms_norm(x, residual, ln2, eps)     (rmsnorm.py)
  logits = F.linear(h, W, b)                              [T, E] (cuBLAS)
  route_and_group(logits, k)                              (moe_routing.py)

three launches whose cost at batch 1 (~10 us a layer on an H100) is mostly launch latency. Here
one program does it all: pass 1 over H chunks adds x to the residual, stores r and sums its squares;
pass 2 reloads r, normalizes it, stores h and feeds that h chunk with the router weight chunk to a
tensor-core dot, so the logits [T, E] never leave registers; then top-k, softmax and the row lists
exactly as moe_routing._route_kernel. One program because a program sees its own writes after a
barrier but not another's without a grid-wide handshake: the decode MoE's old fused router (E
programs, the last to take an atomic ticket routing) once gave wrong ids on the H100 from a
visibility race between its programs (bench/results/2026-11-22_gptoss_gpu.md), and is gone.

Numerics: r and h follow rmsnorm.py step by step (float32 add, one rounding; mean of squares,
1/sqrt_rn, weight * (r * rstd), one rounding); only the order of the sum of squares differs, so h is
exact or 1 ulp off on a few elements. Logits are float32 sums of the bf16 h and W products plus the
bias, rounded to x.dtype as F.linear's output; their summation order differs from cuBLAS's, so a
logit can be 1 ulp off, which reorders experts only when two logits lie within that ulp.

Bytes moved (20b: H 2880, E 32, bf16): router weight E*H*2 = 184 KB, x and residual read, r written
and read back, h written: 5*T*H*2 (29 KB a token), ln2 H*4. One SM's bandwidth bounds it, not FLOPs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from gptoss.kernels import pdl
from gptoss.kernels.moe_routing import Routing
from gptoss.kernels.rounding import round_to

MAX_T = 16  # the whole [BT, BE] logits tile and routing live in one program's registers
MAX_E = 256  # the router weight chunk [BH, BE] with BH >= 32
_BT = 16  # tl.dot's smallest M; T <= 16 rows pad to it


@triton.jit(do_not_specialize=["T"])  # T changes every step: no recompiles on its value
def _norm_route_kernel(
    x_ptr,
    res_ptr,
    nw_ptr,
    h_ptr,
    r_ptr,
    rw_ptr,
    rb_ptr,
    ids_ptr,
    wts_ptr,
    counts_ptr,
    rows_ptr,
    T,
    stride_x,
    stride_res,
    eps,
    H: tl.constexpr,
    E: tl.constexpr,
    TOP_K: tl.constexpr,
    KP: tl.constexpr,
    BT: tl.constexpr,
    BE: tl.constexpr,
    BH: tl.constexpr,
    DOT_F32: tl.constexpr,  # float32 operands, ieee: float32 inputs, or the interpreter (see norm_route)
    PDL: tl.constexpr,
):
    pdl.wait_then_release(PDL)
    t = tl.arange(0, BT)  # [BT]
    t_ok = t < T
    ex = tl.arange(0, BE)  # [BE]
    e_ok = ex < E
    dt = r_ptr.dtype.element_ty
    tl.store(counts_ptr + ex, tl.zeros([BE], tl.int32), mask=e_ok)  # no memset launch needed

    # Pass 1: r = residual + x (float32 sum, one rounding, as torch's add), and r's sum of squares.
    sq = tl.zeros([BT, BH], tl.float32)
    for h0 in range(0, H, BH):
        hc = h0 + tl.arange(0, BH)  # [BH]
        m = t_ok[:, None] & (hc < H)[None, :]  # [BT, BH]; rows past T and columns past H read zeros
        xv = tl.load(x_ptr + t[:, None] * stride_x + hc[None, :], mask=m, other=0.0)
        rv = tl.load(res_ptr + t[:, None] * stride_res + hc[None, :], mask=m, other=0.0)
        r = round_to(xv.to(tl.float32) + rv.to(tl.float32), dt)
        tl.store(r_ptr + t[:, None] * H + hc[None, :], r, mask=m)
        rf = r.to(tl.float32)
        sq += rf * rf
    # 1/sqrt_rn rather than the approximate rsqrt, as rmsnorm.py; padded rows get 1/sqrt(eps) * 0 = 0.
    rstd = 1.0 / tl.sqrt_rn(tl.sum(sq, axis=1) / H + eps)  # [BT]
    tl.debug_barrier()  # every thread's r stored before pass 2 reads other threads' columns

    # Pass 2: h = weight * (r * rstd), one rounding; logits += h chunk @ W chunk^T.
    acc = tl.zeros([BT, BE], tl.float32)
    for h0 in range(0, H, BH):
        hc = h0 + tl.arange(0, BH)  # [BH]
        h_ok = hc < H
        m = t_ok[:, None] & h_ok[None, :]
        rf = tl.load(r_ptr + t[:, None] * H + hc[None, :], mask=m, other=0.0).to(tl.float32)  # [BT, BH]
        nw = tl.load(nw_ptr + hc, mask=h_ok, other=0.0)  # [BH]
        hv = round_to(nw[None, :] * (rf * rstd[:, None]), dt)  # [BT, BH]
        tl.store(h_ptr + t[:, None] * H + hc[None, :], hv, mask=m)
        wv = tl.load(rw_ptr + ex[None, :] * H + hc[:, None], mask=e_ok[None, :] & h_ok[:, None], other=0.0)
        if DOT_F32:  # exact upcasts of the stored values: the same products, float32 sums
            acc = tl.dot(hv.to(tl.float32), wv.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(hv, wv, acc)  # bf16 operands, float32 accumulation
    bias = tl.load(rb_ptr + ex, mask=e_ok, other=0.0).to(tl.float32)  # [BE]
    v = round_to(acc + bias[None, :], dt).to(tl.float32)  # [BT, BE]: F.linear's output rounding
    tl.debug_barrier()  # the counters' zeros stored before any atomic adds to them

    # Routing, as moe_routing._route_kernel: top-k (ties to the lower id), softmax, row lists.
    v = tl.where(e_ok[None, :], v, float("-inf"))
    kc = tl.arange(0, KP)  # [KP]
    top = tl.full([BT, KP], float("-inf"), tl.float32)  # [BT, KP] chosen logits, descending
    for j in tl.static_range(TOP_K):
        mx = tl.max(v, axis=1)  # [BT]
        idx = tl.min(tl.where(v == mx[:, None], ex[None, :], BE), axis=1)  # lowest id among the maxima
        idx = tl.minimum(idx, E - 1)  # NaN rows never match; keep their writes in bounds
        v = tl.where(ex[None, :] == idx[:, None], float("-inf"), v)
        top = tl.where(kc[None, :] == j, mx[:, None], top)
        tl.store(ids_ptr + t * TOP_K + j, idx, mask=t_ok)
        slot = tl.atomic_add(counts_ptr + idx, 1, mask=t_ok)  # [BT] distinct per (expert, token)
        tl.store(rows_ptr + idx * T + slot, t * TOP_K + j, mask=t_ok)
    p = tl.exp(top - tl.max(top, axis=1)[:, None])  # [BT, KP]; unused columns are exp(-inf) = 0
    p = p / tl.sum(p, axis=1)[:, None]
    tl.store(wts_ptr + t[:, None] * TOP_K + kc[None, :], p, mask=t_ok[:, None] & (kc < TOP_K)[None, :])


def _check(
    x: Tensor, residual: Tensor, norm_weight: Tensor, router_weight: Tensor, router_bias: Tensor, top_k: int
) -> None:
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(
            f"norm_route: x must be [T, H] with a contiguous last dim, got {tuple(x.shape)} "
            f"strides {x.stride()}"
        )
    t, h = x.shape
    if not 1 <= t <= MAX_T:
        raise ValueError(f"norm_route: T = {t} must be in [1, {MAX_T}] (one program routes every token)")
    if x.dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"norm_route: x must be bfloat16 or float32, got {x.dtype}")
    if residual.shape != x.shape or residual.dtype != x.dtype or residual.stride(-1) != 1:
        raise ValueError(
            f"norm_route: residual must match x ({tuple(x.shape)}, {x.dtype}, contiguous last dim), got "
            f"{tuple(residual.shape)}, {residual.dtype}, strides {residual.stride()}"
        )
    if norm_weight.shape != (h,) or not norm_weight.is_contiguous():
        raise ValueError(
            f"norm_route: norm_weight must be a contiguous [{h}], got {tuple(norm_weight.shape)}"
        )
    if router_weight.dim() != 2 or router_weight.shape[1] != h or not router_weight.is_contiguous():
        raise ValueError(
            f"norm_route: router_weight must be a contiguous [E, {h}], got {tuple(router_weight.shape)}"
        )
    e = router_weight.shape[0]
    if not 1 <= e <= MAX_E:
        raise ValueError(f"norm_route: E = {e} must be in [1, {MAX_E}]")
    if router_bias.shape != (e,) or not router_bias.is_contiguous():
        raise ValueError(
            f"norm_route: router_bias must be a contiguous [{e}], got {tuple(router_bias.shape)}"
        )
    if router_weight.dtype != x.dtype or router_bias.dtype != x.dtype:
        raise ValueError(
            f"norm_route: router weight and bias must be x's dtype {x.dtype} (as F.linear), got "
            f"{router_weight.dtype}, {router_bias.dtype}"
        )
    if not 1 <= top_k <= e:
        raise ValueError(f"norm_route: top_k must be in [1, {e}], got {top_k}")
    others = (residual, norm_weight, router_weight, router_bias)
    if any(o.device != x.device for o in others):
        raise ValueError(f"norm_route: every tensor must be on x's device {x.device}")


def norm_route(
    x: Tensor,
    residual: Tensor,
    norm_weight: Tensor,
    eps: float,
    router_weight: Tensor,
    router_bias: Tensor,
    top_k: int,
) -> tuple[Tensor, Tensor, Routing]:
    """x, residual [T, H] -> (h [T, H], r [T, H], Routing): fused_add_rms_norm, then
    route_and_group(F.linear(h, W, b), k); T in [1, 16]."""
    _check(x, residual, norm_weight, router_weight, router_bias, top_k)
    t, h = x.shape
    e = router_weight.shape[0]
    dev = x.device
    hn = torch.empty(t, h, dtype=x.dtype, device=dev)  # [T, H]
    r = torch.empty(t, h, dtype=x.dtype, device=dev)  # [T, H]
    ids = torch.empty(t, top_k, dtype=torch.int32, device=dev)
    weights = torch.empty(t, top_k, dtype=torch.float32, device=dev)
    counts = torch.empty(e, dtype=torch.int32, device=dev)  # zeroed by the kernel
    rows = torch.empty(e, t, dtype=torch.int32, device=dev)
    be = max(16, triton.next_power_of_2(e))  # tl.dot's smallest N
    _norm_route_kernel[(1,)](
        x,
        residual,
        norm_weight,
        hn,
        r,
        router_weight,
        router_bias,
        ids,
        weights,
        counts,
        rows,
        t,
        x.stride(0),
        residual.stride(0),
        eps,
        H=h,
        E=e,
        TOP_K=top_k,
        KP=triton.next_power_of_2(top_k),
        BT=_BT,
        BE=be,
        BH=min(256, 8192 // be),  # the weight chunk [BH, BE] at 8K values: 32 registers a thread
        # Triton 3.6's interpreter multiplies the raw bits of bf16 dot operands; the operands are
        # exact bf16 values, so their float32 upcasts give the GPU's products there.
        DOT_F32=x.dtype == torch.float32 or bool(triton.knobs.runtime.interpret),
        num_warps=8,
        **pdl.args(x),
    )
    return hn, r, Routing(ids, weights, counts, rows)

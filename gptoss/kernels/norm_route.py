"""Decode (T <= 16): residual add + RMSNorm and the router GEMM in one launch, then the routing.

norm_route(x, residual, ln2, eps, W, b, k) = (h, r, Routing) of

  h, r   = fused_add_rms_norm(x, residual, ln2, eps)     (rmsnorm.py)
  logits = F.linear(h, W, b)                              [T, E] (cuBLAS: a split-K GEMV + its reduce)
  route_and_group(logits, k)                              (moe_routing.py)

four launches whose cost at batch 1 (~10 us a layer on an H100: rmsnorm 2.4, cuBLAS 4.3 + 1.8,
routing 3.8) is mostly launch latency and single-SM latency chains. Here _norm_logits_kernel runs
one program per expert: each adds x to the residual and normalizes every token itself (T*H values,
from L2 after the first program) and takes the dot of h with its one router row, so no program waits
for another; program 0 also stores r and h. route_and_group then routes the [T, E] logits. A single
program doing all of it (the first version: 184 KB of router weights through one SM, ~36 us a
layer on the H100) and E programs handing the routing to the last one by an atomic ticket (the
decode MoE's old fused router: wrong ids once, from a visibility race) were both worse.

Numerics: r and h follow rmsnorm.py step by step (float32 add, one rounding; mean of squares,
1/sqrt_rn, weight * (r * rstd), one rounding); only the order of the sum of squares differs, so h is
exact or 1 ulp off on a few elements. Logits are float32 sums of the bf16 h and W products plus the
bias, rounded to x.dtype as F.linear's output; their summation order differs from cuBLAS's, so a
logit can be 1 ulp off, which reorders experts only when two logits lie within that ulp.

Bytes (20b: H 2880, E 32, bf16): the router weight E*H*2 = 184 KB once over E programs; x and the
residual T*H*2 each, read twice by every program (L2); r and h written once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from gptoss.kernels import pdl
from gptoss.kernels.moe_routing import Routing, route_and_group
from gptoss.kernels.rounding import round_to

MAX_T = 16  # route_and_group's single-program path covers far more; 16 is the decode MoE's limit
MAX_E = 256
_BH = 512  # H per step: [BT, BH] float32 tiles stay in registers at BT 16 and 4 warps


@triton.jit
def _residual_chunk(x_ptr, res_ptr, t, hc, m, stride_x, stride_res, DT: tl.constexpr):
    """r = residual + x for a [BT, BH] chunk: float32 sum, one rounding (torch's add)."""
    xv = tl.load(x_ptr + t[:, None] * stride_x + hc[None, :], mask=m, other=0.0)
    rv = tl.load(res_ptr + t[:, None] * stride_res + hc[None, :], mask=m, other=0.0)
    return round_to(xv.to(tl.float32) + rv.to(tl.float32), DT)


@triton.jit(do_not_specialize=["T"])  # T changes every step: no recompiles on its value
def _norm_logits_kernel(
    x_ptr,
    res_ptr,
    nw_ptr,
    h_ptr,
    r_ptr,
    rw_ptr,
    rb_ptr,
    logits_ptr,
    T,
    stride_x,
    stride_res,
    eps,
    H: tl.constexpr,
    E: tl.constexpr,
    BT: tl.constexpr,
    BH: tl.constexpr,
    PDL: tl.constexpr,
):
    """Program e: logits[:, e] = h @ W[e] + b[e] (rounded as F.linear's output); program 0 stores r, h."""
    pdl.wait_then_release(PDL)
    e = tl.program_id(0)
    first = e == 0
    t = tl.arange(0, BT)  # [BT]
    t_ok = t < T
    DT: tl.constexpr = r_ptr.dtype.element_ty
    sq = tl.zeros([BT, BH], tl.float32)
    for h0 in range(0, H, BH):
        hc = h0 + tl.arange(0, BH)  # [BH]
        m = t_ok[:, None] & (hc < H)[None, :]  # [BT, BH]; rows past T and columns past H read zeros
        r = _residual_chunk(x_ptr, res_ptr, t, hc, m, stride_x, stride_res, DT)
        tl.store(r_ptr + t[:, None] * H + hc[None, :], r, mask=m & first)
        rf = r.to(tl.float32)
        sq += rf * rf
    # 1/sqrt_rn rather than the approximate rsqrt, as rmsnorm.py; padded rows get 1/sqrt(eps) * 0 = 0.
    rstd = 1.0 / tl.sqrt_rn(tl.sum(sq, axis=1) / H + eps)  # [BT]
    acc = tl.zeros([BT, BH], tl.float32)
    for h0 in range(0, H, BH):
        hc = h0 + tl.arange(0, BH)
        h_ok = hc < H
        m = t_ok[:, None] & h_ok[None, :]
        # r again from x and the residual (not from program 0's store: no program reads another's writes)
        rf = _residual_chunk(x_ptr, res_ptr, t, hc, m, stride_x, stride_res, DT).to(tl.float32)
        nw = tl.load(nw_ptr + hc, mask=h_ok, other=0.0)  # [BH]
        hv = round_to(nw[None, :] * (rf * rstd[:, None]), DT)  # [BT, BH]
        tl.store(h_ptr + t[:, None] * H + hc[None, :], hv, mask=m & first)
        wv = tl.load(rw_ptr + e * H + hc, mask=h_ok, other=0.0)  # [BH]
        acc += hv.to(tl.float32) * wv.to(tl.float32)[None, :]  # exact products, float32 sums
    logit = tl.sum(acc, axis=1) + tl.load(rb_ptr + e).to(tl.float32)  # [BT]
    logit = round_to(logit, DT).to(tl.float32)  # F.linear's output rounding
    tl.store(logits_ptr + t * E + e, logit, mask=t_ok)


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
    hn = torch.empty(t, h, dtype=x.dtype, device=x.device)  # [T, H]
    r = torch.empty(t, h, dtype=x.dtype, device=x.device)  # [T, H]
    logits = torch.empty(t, e, dtype=torch.float32, device=x.device)  # [T, E]
    _norm_logits_kernel[(e,)](
        x,
        residual,
        norm_weight,
        hn,
        r,
        router_weight,
        router_bias,
        logits,
        t,
        x.stride(0),
        residual.stride(0),
        eps,
        H=h,
        E=e,
        BT=max(2, triton.next_power_of_2(t)),
        BH=min(_BH, triton.next_power_of_2(h)),
        num_warps=4,
        **pdl.args(x),
    )
    return hn, r, route_and_group(logits, top_k)

"""Decode (T <= 16): residual add + RMSNorm and the router GEMV in one launch.

norm_logits(x, residual, ln2, eps, W, b) = (h, r, logits) of

  h, r   = fused_add_rms_norm(x, residual, ln2, eps)     (rmsnorm.py)
  logits = F.linear(h, W, b)                              [T, E] (cuBLAS: a split-K GEMV + its reduce)

and norm_route adds route_and_group(logits, k) (moe_routing.py). The engine's decode path takes the
logits alone and routes inside the first expert GEMM (moe_decode.experts_dec_logits), so a layer's
router costs this one launch, against four unfused (~10 us a layer at batch 1 on an H100: rmsnorm
2.4, cuBLAS 4.3 + 1.8, routing 3.8), which are mostly launch latency and single-SM latency chains.

_norm_logits_kernel runs a program per (expert, token): it loads the token's x and residual row,
the norm weight and its one router row in a single round (H <= 8192 in registers: one DRAM/L2
latency, not a chain), adds and normalizes the row itself and takes the dot; program (0, t) also
stores r[t] and h[t]. The weights (norm, router row, bias) load before the PDL wait, x and the
residual after it (2026-11-29, untimed: as gemv_preload does with W, one DRAM trip less after the
wait). No program reads another's writes. The first versions were slower than the
four launches: one program for all (184 KB of router weights through one SM, ~36 us a layer), and a
program per expert looping over 512-column chunks of every token twice (a chain of ~12 dependent
loads; 377.5 vs 388.6 tok/s at batch 1); E programs handing the routing to the last one by an atomic
ticket gave wrong ids once (a visibility race).

Numerics: r and h follow rmsnorm.py step by step (float32 add, one rounding; mean of squares,
1/sqrt_rn, weight * (r * rstd), one rounding); only the order of the sum of squares differs, so h is
exact or 1 ulp off on a few elements. Logits are float32 sums of the bf16 h and W products plus the
bias, rounded to x.dtype as F.linear's output; their summation order differs from cuBLAS's, so a
logit can be 1 ulp off, which reorders experts only when two logits lie within that ulp.

Bytes (20b: H 2880, E 32, bf16): the router weight E*H*2 = 184 KB once over the programs; x and the
residual T*H*2 each, read by every expert's program (L2 after the first); r and h written once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from gptoss.kernels import pdl
from gptoss.kernels.moe_routing import Routing, route_and_group
from gptoss.kernels.rounding import round_to

MAX_T = 16  # the decode MoE's limit
MAX_E = 256
MAX_H = 8192  # a row in registers: 8192 / (32 * warps) floats a thread and tensor
# norm_logits releases the next kernel right after its PDL wait. A switch that released only as its
# programs exit (so a PDL-launched gate_up would be placed on the SMs these leave) was timed with
# moe_v3_dec_gu's (H200, 120b batch 1, v40): the gate_up launched with PDL and no early release of its
# own lost (385.6 tok/s against 438.6, its 555 -> 865 us a token), and with norm_logits not releasing
# either it was back at 556 us and 438.1 / 427.6 tok/s, noise. So the gate_up launches plainly, and
# what slowed it with PDL is its programs placed beside norm_logits'. Both switches are gone.


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
    BH: tl.constexpr,
    PDL: tl.constexpr,
):
    """Program (e, t): logits[t, e] = h[t] @ W[e] + b[e] (F.linear's output rounding); e == 0 stores r, h."""
    e = tl.program_id(0)
    t = tl.program_id(1).to(tl.int64)
    DT: tl.constexpr = r_ptr.dtype.element_ty
    hc = tl.arange(0, BH)
    m = hc < H
    # The weights never change: their loads leave before the PDL wait, so with PDL the router row
    # (from DRAM: 128 rows are 737 KB at 120b) streams while the kernel before (the down GEMM) ends,
    # and after the wait only x and the residual (from L2) stand between the wait and the sums.
    nw = tl.load(nw_ptr + hc, mask=m, other=0.0)
    wv = tl.load(rw_ptr + e * H + hc, mask=m, other=0.0)
    bias = tl.load(rb_ptr + e).to(tl.float32)
    pdl.wait_then_release(PDL)
    xv = tl.load(x_ptr + t * stride_x + hc, mask=m, other=0.0)
    rv = tl.load(res_ptr + t * stride_res + hc, mask=m, other=0.0)
    r = round_to(xv.to(tl.float32) + rv.to(tl.float32), DT)  # torch's add: float32 sum, one rounding
    rf = r.to(tl.float32)
    # 1/sqrt_rn rather than the approximate rsqrt, as rmsnorm.py.
    rstd = 1.0 / tl.sqrt_rn(tl.sum(rf * rf, axis=0) / H + eps)
    hv = round_to(nw * (rf * rstd), DT)  # [BH]
    if e == 0:
        tl.store(r_ptr + t * H + hc, r, mask=m)
        tl.store(h_ptr + t * H + hc, hv, mask=m)
    logit = tl.sum(hv.to(tl.float32) * wv.to(tl.float32), axis=0) + bias
    tl.store(logits_ptr + t * E + e, round_to(logit, DT).to(tl.float32))  # F.linear's output rounding


def _check(
    x: Tensor, residual: Tensor, norm_weight: Tensor, router_weight: Tensor, router_bias: Tensor
) -> None:
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(
            f"norm_route: x must be [T, H] with a contiguous last dim, got {tuple(x.shape)} "
            f"strides {x.stride()}"
        )
    t, h = x.shape
    if not 1 <= t <= MAX_T:
        raise ValueError(f"norm_route: T = {t} must be in [1, {MAX_T}] (the decode MoE's sizes)")
    if h > MAX_H:
        raise ValueError(f"norm_route: H = {h} must be <= {MAX_H} (a row in registers)")
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
    others = (residual, norm_weight, router_weight, router_bias)
    if any(o.device != x.device for o in others):
        raise ValueError(f"norm_route: every tensor must be on x's device {x.device}")


def norm_logits(
    x: Tensor,
    residual: Tensor,
    norm_weight: Tensor,
    eps: float,
    router_weight: Tensor,
    router_bias: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """x, residual [T, H] -> (h [T, H], r [T, H], logits [T, E] float32): fused_add_rms_norm, then
    F.linear(h, W, b) (its output rounding kept); T in [1, 16]."""
    _check(x, residual, norm_weight, router_weight, router_bias)
    t, h = x.shape
    e = router_weight.shape[0]
    hn = torch.empty(t, h, dtype=x.dtype, device=x.device)  # [T, H]
    r = torch.empty(t, h, dtype=x.dtype, device=x.device)  # [T, H]
    logits = torch.empty(t, e, dtype=torch.float32, device=x.device)  # [T, E]
    bh = triton.next_power_of_2(h)
    _norm_logits_kernel[(e, t)](
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
        BH=bh,
        num_warps=max(1, min(8, bh // 512)),  # 16 floats a thread and tensor
        **pdl.args(x),
    )
    return hn, r, logits


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
    e = router_weight.shape[0]
    if not 1 <= top_k <= e:  # before the launch; norm_logits checks the rest
        raise ValueError(f"norm_route: top_k must be in [1, {e}], got {top_k}")
    hn, r, logits = norm_logits(x, residual, norm_weight, eps, router_weight, router_bias)
    return hn, r, route_and_group(logits, top_k)

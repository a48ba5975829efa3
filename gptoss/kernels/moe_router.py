"""The MoE router and its routing in one launch, for batches past the single-program routing.

route_tokens(x, W, b, k) = route_and_group(F.linear(x, W, b), k): logits [T, E] = x @ W^T + b, each
token's top-k, the softmax over them, and every expert's list of rows. Unfused that is three to four
launches: cuBLAS's GEMM (at T 1,024 with E 32 a split-K GEMM and its reduce, 6.1 + 4.1 µs on an
H200, v64's Nsight Compute), the counts' memset and the routing kernel (6.4 µs: 4,096 atomic
increments on 32 counters). Here a program takes BLOCK_T tokens: their logits by tl.dot over H (the
router weight, 184 KB at E 32, stays in L2 for every program), rounded to x's dtype as F.linear's
output is, then moe_routing.topk_values (the routing kernel's own decision), and one atomic add per
expert for the program's whole block of assignments, each assignment's place in the block from a
cumulative sum. The counts' memset stays (several programs add to them).

The logits' sum runs in another order than cuBLAS's, so a near tie between the k-th and the next
expert may break the other way: an equally valid top-k of the rounded logits (the decode path's
in-kernel routers already differ from cuBLAS in the same way). STORE_LOGITS writes the rounded
logits, which the tests route again through route_and_group to check every decision exactly.

GPTOSS_FUSED_ROUTER=0 turns it off (F.linear + route_and_group at every T, as before v71);
FROM_T, BLOCK_T, BLOCK_K, WARPS and STAGES are module attributes for bench/kernels/router_gpu.py.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from gptoss.kernels import pdl
from gptoss.kernels.moe_routing import SINGLE_PROGRAM_MAX_TOKENS, Routing, route_and_group, topk_values

ENABLED = os.environ.get("GPTOSS_FUSED_ROUTER", "1") != "0"
FROM_T = SINGLE_PROGRAM_MAX_TOKENS + 1  # below, one routing program needs no memset: cuBLAS + it
BLOCK_T = 16  # tokens a program: T 1,024 fills 64 SMs, each reading 92 KB of x
BLOCK_K = 64
WARPS = 4
STAGES = 3


@triton.jit(do_not_specialize=["T"])  # T changes every step: no recompiles on its value
def _router_route_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    logits_ptr,
    ids_ptr,
    wts_ptr,
    counts_ptr,
    rows_ptr,
    T,
    H,
    stride_x,
    E: tl.constexpr,
    TOP_K: tl.constexpr,
    KP: tl.constexpr,
    BT: tl.constexpr,
    BE: tl.constexpr,
    BK: tl.constexpr,
    IEEE: tl.constexpr,
    STORE_LOGITS: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl.wait_then_release(PDL)
    t = tl.program_id(0) * BT + tl.arange(0, BT)  # [BT]
    t_ok = t < T
    ex = tl.arange(0, BE)
    e_ok = ex < E
    acc = tl.zeros([BT, BE], tl.float32)
    for k0 in range(0, H, BK):
        kk = k0 + tl.arange(0, BK)
        k_ok = kk < H
        xa = tl.load(
            x_ptr + t[:, None] * stride_x + kk[None, :], mask=t_ok[:, None] & k_ok[None, :], other=0.0
        )
        wb = tl.load(w_ptr + ex[None, :] * H + kk[:, None], mask=e_ok[None, :] & k_ok[:, None], other=0.0)
        if IEEE:  # float32 weights: F.linear's full-precision product, not TF32's
            acc = tl.dot(xa, wb, acc, input_precision="ieee")
        else:
            acc = tl.dot(xa, wb, acc)
    bias = tl.load(b_ptr + ex, mask=e_ok, other=0.0).to(tl.float32)
    # F.linear's output is x's dtype: the routing sees the logits rounded as the unfused path's are
    rounded = (acc + bias[None, :]).to(x_ptr.dtype.element_ty)
    if STORE_LOGITS:
        tl.store(logits_ptr + t[:, None] * E + ex[None, :], rounded, mask=t_ok[:, None] & e_ok[None, :])
    ids, p = topk_values(rounded.to(tl.float32), t_ok, E, TOP_K, KP, BE)  # ids -1 past T and TOP_K
    kc = tl.arange(0, KP)
    tl.store(ids_ptr + t[:, None] * TOP_K + kc[None, :], ids, mask=t_ok[:, None] & (kc < TOP_K)[None, :])
    tl.store(wts_ptr + t[:, None] * TOP_K + kc[None, :], p, mask=t_ok[:, None] & (kc < TOP_K)[None, :])
    # the block's assignments a = t*k + j grouped by expert: one atomic add per expert gives the
    # block's base in that expert's list, the exclusive cumulative count each one's place after it
    A: tl.constexpr = BT * KP
    flat = tl.reshape(ids, (A,))
    a = tl.reshape(t[:, None] * TOP_K + kc[None, :], (A,))
    hit = (flat[:, None] == ex[None, :]).to(tl.int32)  # [A, BE]; -1 (no assignment) hits nothing
    place = tl.sum((tl.cumsum(hit, axis=0) - hit) * hit, axis=1)  # [A]
    cnt = tl.sum(hit, axis=0)  # [BE]
    base = tl.atomic_add(counts_ptr + ex, cnt, mask=e_ok & (cnt > 0))  # [BE]; unused where cnt is 0
    start = tl.sum(hit * base[None, :], axis=1)  # [A]
    tl.store(rows_ptr + flat * T + start + place, a, mask=flat >= 0)


def fused(x: Tensor) -> bool:
    """Whether route_tokens takes the fused kernel for x [T, H]."""
    return ENABLED and x.shape[0] >= FROM_T and (x.is_cuda or triton.knobs.runtime.interpret)


def router_route(
    x: Tensor, weight: Tensor, bias: Tensor, top_k: int, logits: Tensor | None = None
) -> Routing:
    """x [T, H], router weight [E, H] and bias [E] (x's dtype) -> route_and_group(F.linear(x, weight,
    bias), top_k)'s Routing in one launch (and a memset). logits: a [T, E] buffer in x's dtype that
    receives the rounded logits the routing decided on."""
    t, h = x.shape
    e = weight.shape[0]
    if weight.shape != (e, h) or bias.shape != (e,) or not 1 <= top_k <= e:
        raise ValueError(
            f"router_route: x {tuple(x.shape)}, weight {tuple(weight.shape)}, bias {tuple(bias.shape)}, "
            f"top_k {top_k}: need weight [E, H], bias [E] and 1 <= top_k <= E"
        )
    if weight.dtype != x.dtype or bias.dtype != x.dtype:
        raise ValueError(f"router_route: weight and bias must be x's dtype {x.dtype}, as F.linear's")
    if logits is not None and (
        logits.shape != (t, e) or logits.dtype != x.dtype or not logits.is_contiguous()
    ):
        raise ValueError(f"router_route: logits must be a contiguous [{t}, {e}] {x.dtype} buffer")
    x, weight = x.contiguous(), weight.contiguous()
    r = Routing.empty(t, top_k, e, x.device)
    r.counts.zero_()
    if t:
        _router_route_kernel[(triton.cdiv(t, BLOCK_T),)](
            x,
            weight,
            bias,
            logits if logits is not None else r.weights,  # unread: STORE_LOGITS is off
            r.ids,
            r.weights,
            r.counts,
            r.rows,
            t,
            h,
            x.stride(0),
            E=e,
            TOP_K=top_k,
            KP=triton.next_power_of_2(top_k),
            BT=BLOCK_T,
            BE=max(16, triton.next_power_of_2(e)),
            BK=BLOCK_K,
            IEEE=x.dtype == torch.float32,
            STORE_LOGITS=logits is not None,
            num_warps=WARPS,
            num_stages=STAGES,
            **pdl.args(x),
        )
    return r


def route_tokens(x: Tensor, weight: Tensor, bias: Tensor, top_k: int) -> Routing:
    """The MoE's routing of x [T, H]: router_route where fused(x), else F.linear + route_and_group."""
    if fused(x):
        return router_route(x, weight, bias, top_k)
    return route_and_group(F.linear(x, weight, bias), top_k)

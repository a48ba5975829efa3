"""The decode MoE's fused router (moe_decode.ROUTER_FUSED, off by default): logits, top-k, softmax and
the per-expert row lists of route_and_group in one launch, the grid's last program found with an
atomic ticket. Off because on the H100 its ids once differed from route_and_group's on its own logits
(T 5, E 32): a visibility bug between its programs, not yet found (bench/results v9)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from gptoss.kernels import moe_common as common
from gptoss.kernels.moe_routing import Routing


@triton.jit
def _fence(v, ASM: tl.constexpr):
    """A gpu-scope fence after this thread's stores (CUDA; the interpreter runs programs in order)."""
    if ASM:
        v = tl.inline_asm_elementwise(
            "fence.acq_rel.gpu; mov.b32 $0, $1;", "=r,r", [v], dtype=tl.int32, is_pure=False, pack=1
        )
    return v


@triton.jit(do_not_specialize=["T"])  # T changes every step: no recompiles on its value
def _router_kernel(
    x_ptr,
    rw_ptr,
    rb_ptr,
    logits_ptr,
    ticket_ptr,
    ids_ptr,
    wts_ptr,
    counts_ptr,
    rows_ptr,
    T,
    stride_x,
    H: tl.constexpr,
    E: tl.constexpr,
    TOP_K: tl.constexpr,
    KP: tl.constexpr,
    BT: tl.constexpr,
    BE: tl.constexpr,
    BH: tl.constexpr,
    ASM: tl.constexpr,
):
    """Program e: logits[:, e] in float32 (rounded through x's dtype); the last to finish routes."""
    e = tl.program_id(0)
    t = tl.arange(0, BT)
    t_ok = t < T
    acc = tl.zeros([BT, BH], tl.float32)
    for h0 in range(0, H, BH):
        h = h0 + tl.arange(0, BH)
        h_ok = h < H
        xv = tl.load(
            x_ptr + t[:, None] * stride_x + h[None, :], mask=t_ok[:, None] & h_ok[None, :], other=0.0
        )
        wv = tl.load(rw_ptr + e * H + h, mask=h_ok, other=0.0)
        acc += xv.to(tl.float32) * wv.to(tl.float32)[None, :]
    logit = tl.sum(acc, 1) + tl.load(rb_ptr + e).to(tl.float32)  # [BT]
    logit = logit.to(x_ptr.dtype.element_ty).to(tl.float32)  # F.linear's output rounding
    tl.store(logits_ptr + t * E + e, logit, mask=t_ok)
    _fence(t, ASM)
    tl.debug_barrier()  # every thread's logits stored and fenced before the ticket
    done = tl.atomic_add(ticket_ptr, 1)  # acq_rel, gpu scope
    if done == E - 1:  # the last program: every logit is in; route as _route_kernel does
        tl.store(ticket_ptr, 0)  # ready for the next call (stream order publishes it)
        ex = tl.arange(0, BE)
        tl.store(counts_ptr + ex, tl.zeros([BE], tl.int32), mask=ex < E)
        tl.debug_barrier()
        v = tl.load(
            logits_ptr + t[:, None] * E + ex[None, :],
            mask=t_ok[:, None] & (ex < E)[None, :],
            other=0.0,
            cache_modifier=".cg",  # from L2: written by other SMs
        )
        v = tl.where((ex < E)[None, :], v, float("-inf"))
        kc = tl.arange(0, KP)
        top = tl.full([BT, KP], float("-inf"), tl.float32)
        for j in tl.static_range(TOP_K):
            m = tl.max(v, axis=1)
            idx = tl.min(tl.where(v == m[:, None], ex[None, :], BE), axis=1)  # lowest id among the maxima
            idx = tl.minimum(idx, E - 1)
            v = tl.where(ex[None, :] == idx[:, None], float("-inf"), v)
            top = tl.where(kc[None, :] == j, m[:, None], top)
            tl.store(ids_ptr + t * TOP_K + j, idx, mask=t_ok)
            slot = tl.atomic_add(counts_ptr + idx, 1, mask=t_ok)
            tl.store(rows_ptr + idx * T + slot, t * TOP_K + j, mask=t_ok)
        p = tl.exp(top - tl.max(top, axis=1)[:, None])
        p = p / tl.sum(p, axis=1)[:, None]
        tl.store(wts_ptr + t[:, None] * TOP_K + kc[None, :], p, mask=t_ok[:, None] & (kc < TOP_K)[None, :])


_TICKETS: dict[torch.device, Tensor] = {}


def _ticket(device: torch.device) -> Tensor:
    """One int32 counter per device, zero between calls (created on the first, eager, call)."""
    t = _TICKETS.get(device)
    if t is None:
        t = _TICKETS[device] = torch.zeros(1, dtype=torch.int32, device=device)
    return t


def route_fused(x: Tensor, router_weight: Tensor, router_bias: Tensor, top_k: int) -> tuple[Routing, Tensor]:
    """x [T, H] -> (Routing as route_and_group(F.linear(x, w, b), k), logits [T, E] float32); T <= 64."""
    x = x.contiguous()
    t, h = x.shape
    e = router_weight.shape[0]
    if not 0 < t <= 64 or not 1 <= top_k <= e:
        raise ValueError(f"route_fused: T = {t} must be in [1, 64] and top_k = {top_k} in [1, {e}]")
    dev = x.device
    logits = torch.empty(t, e, dtype=torch.float32, device=dev)
    ids = torch.empty(t, top_k, dtype=torch.int32, device=dev)
    weights = torch.empty(t, top_k, dtype=torch.float32, device=dev)
    counts = torch.empty(e, dtype=torch.int32, device=dev)
    rows = torch.empty(e, t, dtype=torch.int32, device=dev)
    bt = max(2, triton.next_power_of_2(t))
    _router_kernel[(e,)](
        x,
        router_weight.contiguous(),
        router_bias,
        logits,
        _ticket(dev),
        ids,
        weights,
        counts,
        rows,
        t,
        x.stride(0),
        H=h,
        E=e,
        TOP_K=top_k,
        KP=triton.next_power_of_2(top_k),
        BT=bt,
        BE=triton.next_power_of_2(e),
        BH=min(triton.next_power_of_2(h), 512),  # one summation order for every T: batch-invariant
        ASM=common._use_asm(x),
        num_warps=4,
    )
    return Routing(ids, weights, counts, rows), logits

"""MoE routing on the GPU: top-k + softmax over the k logits, and each expert's list of rows.

One kernel, no host sync (CUDA-graph capturable): every token picks its k largest logits (ties go
to the lower expert id), softmaxes them in float32, and appends its assignment a = t*k + j to its
experts' lists with an atomic counter per expert. The lists are [E, T] (an expert gets each token
at most once, so T slots suffice); their order within an expert depends on atomic timing, which
changes nothing downstream: every row of a grouped GEMM is computed on its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from gptoss.kernels import pdl

SINGLE_PROGRAM_MAX_TOKENS = 64  # up to this, one program routes everything and zeroes the counters itself
_BLOCK_T = 64


@dataclass(frozen=True, slots=True)
class Routing:
    ids: Tensor  # [T, k] int32 expert of each (token, slot)
    weights: Tensor  # [T, k] float32 softmax over the token's k logits
    counts: Tensor  # [E] int32 assignments per expert
    rows: Tensor  # [E, T] int32: rows[e, :counts[e]] are the assignments (t*k + j) routed to e

    @classmethod
    def empty(cls, t: int, top_k: int, e: int, device: torch.device) -> Routing:
        """Unwritten buffers for T tokens, top-k of E experts: a routing kernel fills them."""
        return cls(
            torch.empty(t, top_k, dtype=torch.int32, device=device),
            torch.empty(t, top_k, dtype=torch.float32, device=device),
            torch.empty(e, dtype=torch.int32, device=device),
            torch.empty(e, t, dtype=torch.int32, device=device),
        )


@triton.jit
def _topk(
    logits_ptr, t, t_ok, stride_t, E: tl.constexpr, TOP_K: tl.constexpr, KP: tl.constexpr, BE: tl.constexpr
):
    """The routing decision of tokens t [BT] (t_ok: real ones): ids [BT, KP] int32 (-1 in slots past
    TOP_K and rows past T) and weights [BT, KP] float32 (0 in slots past TOP_K). The one definition
    both the routing kernel and the decode GEMM that routes in registers (moe_decode) use."""
    ex = tl.arange(0, BE)  # [BE]
    # [BT, BE]; rows past T read as zeros (finite, so their masked-out softmax stays quiet)
    v = tl.load(
        logits_ptr + t[:, None] * stride_t + ex[None, :], mask=t_ok[:, None] & (ex < E)[None, :], other=0.0
    ).to(tl.float32)
    v = tl.where((ex < E)[None, :], v, float("-inf"))
    kc = tl.arange(0, KP)  # [KP]
    top = tl.full([t.shape[0], KP], float("-inf"), tl.float32)  # [BT, KP] chosen logits, descending
    ids = tl.full([t.shape[0], KP], -1, tl.int32)
    for j in tl.static_range(TOP_K):
        m = tl.max(v, axis=1)  # [BT]
        idx = tl.min(tl.where(v == m[:, None], ex[None, :], BE), axis=1)  # lowest id among the maxima
        idx = tl.minimum(idx, E - 1)  # NaN rows never match; keep their writes in bounds
        v = tl.where(ex[None, :] == idx[:, None], float("-inf"), v)
        top = tl.where(kc[None, :] == j, m[:, None], top)
        ids = tl.where((kc[None, :] == j) & t_ok[:, None], idx[:, None], ids)
    p = tl.exp(top - tl.max(top, axis=1)[:, None])  # [BT, KP]; unused columns are exp(-inf) = 0
    return ids, p / tl.sum(p, axis=1)[:, None]


@triton.jit
def _topk_one(logits_ptr, s, E: tl.constexpr, TOP_K: tl.constexpr, KP: tl.constexpr, BE: tl.constexpr):
    """_topk's choices of one token's E logits in half its reductions -> (ids [1, KP], their logits
    top [1, KP] (store_one's softmax), the s-th choice): each round takes one max over (value,
    lower id) packed into an int64 key, where _topk takes a max and then the lowest id holding it
    (an in-kernel router at batch 1 waits for both before its first weight load). The same choices
    for any logits but NaN (which _topk never picks and this would; no finite router gives one):
    the key orders the float32 bits as the values (-0 as +0, as _topk's == sees them), ties to the
    lower id."""
    ex = tl.arange(0, BE)
    v = tl.load(logits_ptr + ex, mask=ex < E, other=0.0).to(tl.float32) + 0.0  # -0.0 + 0.0 = +0.0
    bits = v.to(tl.int32, bitcast=True)
    key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # negative floats: magnitude order reversed
    gone = tl.full([BE], -0x7FFFFFFFFFFFFFFF, tl.int64)  # below every value's key: taken or past E
    packed = tl.where(ex < E, (key.to(tl.int64) << 32) | (BE - 1 - ex).to(tl.int64), gone)
    kc = tl.arange(0, KP)[None, :]  # [1, KP]
    top = tl.full([1, KP], float("-inf"), tl.float32)
    ids = tl.full([1, KP], -1, tl.int32)
    chosen = 0
    for j in tl.static_range(TOP_K):
        best = tl.max(packed, axis=0)
        idx = BE - 1 - (best & 0xFFFFFFFF).to(tl.int32)
        hi = (best >> 32).to(tl.int32)
        m = tl.where(hi < 0, hi ^ 0x7FFFFFFF, hi).to(tl.float32, bitcast=True)
        packed = tl.where(ex == idx, gone, packed)
        top = tl.where(kc == j, m, top)
        ids = tl.where(kc == j, idx, ids)
        chosen = tl.where(s == j, idx, chosen)
    return ids, top, chosen


@triton.jit
def store_one(
    ids, top, ids_ptr, w_ptr, counts_ptr, rows_ptr, TOP_K: tl.constexpr, E: tl.constexpr, BE: tl.constexpr
):
    """store_routing for one token routed by _topk_one: its weights as _topk's softmax, each chosen
    expert's count 1 and row list [j] (its assignment), the other counts 0."""
    KP: tl.constexpr = ids.shape[1]
    kc = tl.arange(0, KP)[None, :]
    ok = kc < TOP_K
    p = tl.exp(top - tl.max(top, axis=1)[:, None])  # [1, KP], as _topk: exp(-inf) = 0 past TOP_K
    tl.store(ids_ptr + kc, ids, mask=ok)
    tl.store(w_ptr + kc, p / tl.sum(p, axis=1)[:, None], mask=ok)
    ex = tl.arange(0, BE)
    hit = (tl.reshape(ids, (KP,))[None, :] == ex[:, None]) & (tl.arange(0, KP) < TOP_K)[None, :]  # [BE, KP]
    tl.store(counts_ptr + ex, tl.sum(hit.to(tl.int32), axis=1), mask=ex < E)
    tl.store(rows_ptr + ids, tl.broadcast_to(kc, ids.shape), mask=ok)  # rows[e, 0] = j (T 1)


@triton.jit
def _group(ids, TOP_K: tl.constexpr, KP: tl.constexpr, BE: tl.constexpr):
    """ids [BT, KP] of tokens 0..BT-1 (-1: none) -> flat [A] ids, a [A] assignments t*k + j, pos [A]
    (a's place in its expert's list: assignments in increasing order) and counts [BE]; A = BT*KP."""
    BT: tl.constexpr = ids.shape[0]
    A: tl.constexpr = BT * KP
    flat = tl.reshape(ids, (A,))
    a = tl.reshape(tl.arange(0, BT)[:, None] * TOP_K + tl.arange(0, KP)[None, :], (A,))
    i = tl.arange(0, A)
    before = (flat[:, None] == flat[None, :]) & (i[None, :] < i[:, None])  # [A, A]
    pos = tl.sum(before.to(tl.int32), axis=1)
    counts = tl.sum((flat[:, None] == tl.arange(0, BE)[None, :]).to(tl.int32), axis=0)  # [BE]
    return flat, a, pos, counts


@triton.jit(do_not_specialize=["T"])  # T changes every step: no recompiles on its value
def _route_kernel(
    logits_ptr,
    ids_ptr,
    w_ptr,
    counts_ptr,
    rows_ptr,
    T,
    stride_t,
    E: tl.constexpr,
    TOP_K: tl.constexpr,
    KP: tl.constexpr,
    BT: tl.constexpr,
    BE: tl.constexpr,
    ZERO_COUNTS: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl.wait_then_release(PDL)
    t = tl.program_id(0) * BT + tl.arange(0, BT)  # [BT]
    t_ok = t < T
    ex = tl.arange(0, BE)  # [BE]
    if ZERO_COUNTS:  # the only program: no memset launch needed
        tl.store(counts_ptr + ex, tl.zeros([BE], tl.int32), mask=ex < E)
        tl.debug_barrier()
    ids, p = _topk(logits_ptr, t, t_ok, stride_t, E, TOP_K, KP, BE)
    kc = tl.arange(0, KP)
    for j in tl.static_range(TOP_K):
        idx = tl.sum(tl.where(kc[None, :] == j, ids, 0), axis=1)  # [BT]
        tl.store(ids_ptr + t * TOP_K + j, idx, mask=t_ok)
        slot = tl.atomic_add(counts_ptr + idx, 1, mask=t_ok)  # [BT] distinct per (expert, token)
        tl.store(rows_ptr + idx * T + slot, t * TOP_K + j, mask=t_ok)
    tl.store(w_ptr + t[:, None] * TOP_K + kc[None, :], p, mask=t_ok[:, None] & (kc < TOP_K)[None, :])


@triton.jit
def store_routing(
    ids,
    p,
    flat,
    a,
    pos,
    counts,
    T,
    ids_ptr,
    w_ptr,
    counts_ptr,
    rows_ptr,
    TOP_K: tl.constexpr,
    E: tl.constexpr,
):
    """Write a routing decided in registers (_topk, _group of tokens 0..T-1) as route_and_group's buffers."""
    BT: tl.constexpr = ids.shape[0]
    KP: tl.constexpr = ids.shape[1]
    t = tl.arange(0, BT)
    kc = tl.arange(0, KP)
    ok = (t < T)[:, None] & (kc < TOP_K)[None, :]
    tl.store(ids_ptr + t[:, None] * TOP_K + kc[None, :], ids, mask=ok)
    tl.store(w_ptr + t[:, None] * TOP_K + kc[None, :], p, mask=ok)
    ex = tl.arange(0, counts.shape[0])
    tl.store(counts_ptr + ex, counts, mask=ex < E)
    tl.store(rows_ptr + flat * T + pos, a, mask=flat >= 0)


@triton.jit
def route_in_registers(
    logits_ptr,
    T,
    stride_l,
    store,
    ids_ptr,
    w_ptr,
    counts_ptr,
    rows_ptr,
    E: tl.constexpr,
    TOP_K: tl.constexpr,
    KP: tl.constexpr,
    BE: tl.constexpr,
    BT: tl.constexpr,
):
    """The routing of the [T, E] logits inside an expert GEMM (the decode and v3 gate_up kernels):
    (flat ids, assignments, places, counts [BE]) as _group gives them; where store is true (one
    program), also route_and_group's buffers for the kernels after it."""
    tt = tl.arange(0, BT)
    ids, p = _topk(logits_ptr, tt, tt < T, stride_l, E, TOP_K, KP, BE)
    flat, a, pos, cnt = _group(ids, TOP_K, KP, BE)
    if store:
        store_routing(ids, p, flat, a, pos, cnt, T, ids_ptr, w_ptr, counts_ptr, rows_ptr, TOP_K, E)
    return flat, a, pos, cnt


@triton.jit
def expert_counts(
    logits_ptr,
    T,
    stride_l,
    first,
    ids_ptr,
    w_ptr,
    counts_ptr,
    rows_ptr,
    E: tl.constexpr,
    TOP_K: tl.constexpr,
    KP: tl.constexpr,
    BE: tl.constexpr,
    BT: tl.constexpr,
    ROUTE: tl.constexpr,
):
    """An expert GEMM program's routing -> (flat ids, assignments, places, counts [BE]): ROUTE routes
    the logits in registers (route_in_registers; program `first` stores the buffers), else the
    counts come from the routing kernel's buffer (the other three are then the counts, unused)."""
    if ROUTE:
        flat, a, pos, cnt = route_in_registers(
            logits_ptr, T, stride_l, first, ids_ptr, w_ptr, counts_ptr, rows_ptr, E, TOP_K, KP, BE, BT
        )
    else:
        ex = tl.arange(0, BE)
        cnt = tl.load(counts_ptr + ex, mask=ex < E, other=0)
        flat = cnt
        a = cnt
        pos = cnt
    return flat, a, pos, cnt


@triton.jit
def slot_rows(flat, a, pos, rows_ptr, e, slot, valid, T, ROUTE: tl.constexpr):
    """Expert e's slot-th assignments [BM] (t*k + j): from expert_counts' registers (ROUTE: its place
    in e's list is the slot), else from the routing kernel's lists rows_ptr [E, T]."""
    if ROUTE:
        sel = (flat[None, :] == e) & (pos[None, :] == slot[:, None])  # [BM, A]
        rows = tl.sum(tl.where(sel, a[None, :], 0), axis=1)
    else:
        rows = tl.load(rows_ptr + e * T + slot, mask=valid, other=0)
    return rows


def route_and_group(logits: Tensor, top_k: int, out: Routing | None = None) -> Routing:
    """logits [T, E] -> Routing (out's buffers, filled, if given: Routing.empty(T, top_k, E)'s shapes);
    grid and buffers depend on T and E only."""
    if logits.dim() != 2:
        raise ValueError(f"route: logits must be [T, E], got {tuple(logits.shape)}")
    t, e = logits.shape
    if not 1 <= top_k <= e:
        raise ValueError(f"route: top_k must be in [1, {e}], got {top_k}")
    logits = logits.contiguous()
    dev = logits.device
    single = t <= SINGLE_PROGRAM_MAX_TOKENS
    block_t = max(16, triton.next_power_of_2(t)) if single else _BLOCK_T
    r = Routing.empty(t, top_k, e, dev) if out is None else out
    if out is not None and (out.ids.shape, out.counts.shape, out.rows.shape) != ((t, top_k), (e,), (e, t)):
        raise ValueError(
            f"route: out's buffers ids {tuple(out.ids.shape)}, counts {tuple(out.counts.shape)}, rows "
            f"{tuple(out.rows.shape)} do not fit T {t}, top-{top_k} of E {e}"
        )
    if not single:  # several programs count with atomics: from zero
        r.counts.zero_()
    if t:
        _route_kernel[(triton.cdiv(t, block_t),)](
            logits,
            r.ids,
            r.weights,
            r.counts,
            r.rows,
            t,
            logits.stride(0),
            E=e,
            TOP_K=top_k,
            KP=triton.next_power_of_2(top_k),
            BT=block_t,
            BE=triton.next_power_of_2(e),
            ZERO_COUNTS=single,
            **pdl.args(logits),
        )
    elif single:
        r.counts.zero_()
    return r


def route(logits: Tensor, top_k: int) -> tuple[Tensor, Tensor]:
    """logits [T, E] -> (expert ids [T, k] int32, weights [T, k] float32), as torch.topk + softmax."""
    r = route_and_group(logits, top_k)
    return r.ids, r.weights

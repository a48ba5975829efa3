"""The MoE at decode batch sizes (T <= MAX_T): expert-slot GEMMs on the bits layout.

moe_decode(x, router, ...) = moe_forward for small T, in 5 launches:

  router              F.linear + route_and_group (or, experts_dec_logits: no routing launch, the
                      gate_up kernel routes the logits itself, ROUTE; the engine's GPTOSS_ROUTER=fused
                      takes the logits from norm_route.norm_logits, fused with the add + RMSNorm)
  _gate_up_dec_kernel act = swiglu(x_rows @ W13_e^T + b13_e)   grid (I / BN, slots)
  _down_dec_kernel    y = act @ W2_e^T + b2_e per slot         grid (H / BN, slots)
  moe.combine         out[t] = sum over t's k rows of w * y

Why these shapes. At T <= 16 every expert gets <= 16 rows and the step is bound by the weights:
d * 13.2 MB for d distinct experts (20b). A slot is the s-th expert with rows (the active experts
in id order), so the grids depend on T and the shapes only (slots = min(E, T*k); programs past the
active count exit) and no program looks up an M tile; all of an expert's rows are one tile (rows
past BM loop). Tensor cores rather than FMA: the dequant to bf16 costs the same either way (a
rotate, a mask and half a bf16x2 multiply per value: v2's _dequant_bits), and an HMMA covers up to
8-16 rows for ~0.25 instructions a value, while FMA costs 1 per value and row, plus 1 to widen the
bf16 to float32 (or a 2nd rotate/mask per value to place the e2m1 bits in a float32 directly):
>= 3.4 a value at 1 row, 4.4 at 2, against ~3.0 for the MMA at any row count <= BM (SASS below).
Each K step is split over SPLIT warps (a batched dot, summed once), so every warp owns all BN rows
of its K slice and no weight is dequantized twice. BM (the dot's N) follows T (1, 2, 4, 8; v2 pads
to 16): the x tile in shared memory and its moves shrink with it, so more programs fit an SM.
act is expert-packed (gate_up_dec), so down's load addresses need no row-list load.

Measured on an H100 (20b, bf16, whole MoE in a CUDA graph, us; bench/results/2026-11-22_gptoss_gpu.md
v8), M = 1 / 2 / 4 / 8 / 16: v2 (the M-tile path) 61.7 / 90.8 / 117.2 / 172.6 / 214.7; this path
52.8 / 72.1 / 93.2 / 144.9 / 184.7 (down DecTiles(8, 32, 512, 4, 4, 3), y per slot + moe.combine).
A down with the combine fused (token rows summed in the kernel, in one flat loop over all experts'
row tiles and K steps, or a loop per expert) was slower (55.5 / 78.9 / 108.8 / 205.4 / 253.2; down
alone 20.9-128.1 against 17.1-64.8 us unfused: its grid is H / BN programs only) and gave wrong
results compiled (bf16 rel error up to 7 at some tiles), so it is gone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from gptoss.kernels import moe_common as common
from gptoss.kernels import pdl
from gptoss.kernels.moe_common import _precision
from gptoss.kernels.moe_layout import MoEWeights
from gptoss.kernels.moe_routing import Routing, _group, _topk, route_and_group, store_routing
from gptoss.kernels.moe_tiles import DecTiles, dec_tiles
from gptoss.kernels.moe_v2_step import _v2_ptrs, _v2_step

ENABLED = True  # moe_forward / moe_forward_from_logits take this path for 0 < T <= MAX_T on bits weights
MAX_T = 16  # T*k/E <= 2 rows an expert on average at 20b; past it v2's M tiles amortize the weights


def use_decode(x: Tensor, w: MoEWeights) -> bool:
    """Whether moe_forward takes this path for x [T, H] on w."""
    return ENABLED and w.layout == "bits" and 0 < x.shape[0] <= MAX_T


@triton.jit
def _slot_expert(cnt, ex, s):
    """cnt [BE] rows per expert -> (the s-th expert with rows, its row count, the rows of the experts
    before it: where its act rows start); s past them: (0, 0, 0)."""
    hit = (cnt > 0).to(tl.int32)
    sel = (hit > 0) & ((tl.cumsum(hit, 0) - hit) == s)
    e = tl.sum(tl.where(sel, ex, 0), 0)
    return e, tl.sum(tl.where(sel, cnt, 0), 0), tl.sum(tl.where(ex < e, cnt, 0), 0)


@triton.jit
def _x_tile_ok(valid, kx, k0, K: tl.constexpr, SPLIT: tl.constexpr):
    if SPLIT == 1:
        return valid[None, :] & ((k0 + kx) < K)
    else:
        return valid[None, None, :] & ((k0 + kx) < K)


@triton.jit(do_not_specialize=["T"])
def _gate_up_dec_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    b_ptr,
    act_ptr,
    counts_ptr,
    rows_ptr,
    logits_ptr,
    ids_ptr,
    wts_ptr,
    T,
    stride_l,
    stride_x,
    stride_we,
    stride_wp,
    stride_wn,
    stride_se,
    stride_sp,
    stride_sn,
    alpha,
    limit,
    N: tl.constexpr,
    K: tl.constexpr,
    TOP_K: tl.constexpr,
    E: tl.constexpr,
    BE: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    SPLIT: tl.constexpr,
    PREC: tl.constexpr,
    ASM: tl.constexpr,
    ROUTE: tl.constexpr,
    KP: tl.constexpr,
    BT: tl.constexpr,
    PDL: tl.constexpr,
):
    """Program (column block, slot): act[rows of the slot's expert, block] = swiglu(x @ W13^T + b13).
    ROUTE: every program routes the [T, E] logits in registers (moe_routing._topk, _group: the
    routing kernel's decisions) instead of loading counts and rows; program (0, 0) stores them."""
    pdl.wait_then_release(PDL)
    pid_n, s = tl.program_id(0), tl.program_id(1)
    ex = tl.arange(0, BE)
    if ROUTE:
        tt = tl.arange(0, BT)
        ids, p = _topk(logits_ptr, tt, tt < T, stride_l, E, TOP_K, KP, BE)
        flat, a, pos, cnt = _group(ids, TOP_K, KP, BE)
        if (pid_n == 0) & (s == 0):
            store_routing(ids, p, flat, a, pos, cnt, T, ids_ptr, wts_ptr, counts_ptr, rows_ptr, TOP_K, E)
    else:
        cnt = tl.load(counts_ptr + ex, mask=ex < E, other=0)
    e, n_rows, packed = _slot_expert(cnt, ex, s)
    if n_rows == 0:  # past the active experts
        return
    EVEN_K: tl.constexpr = K % BK == 0
    n = pid_n * BN + tl.arange(0, BN)
    n_ld = n % N  # past-the-end columns reload valid rows; never stored
    e64 = e.to(tl.int64)
    b_g = tl.load(b_ptr + e64 * 2 * N + n_ld)[:, None]  # [BN, 1]
    b_u = tl.load(b_ptr + e64 * 2 * N + N + n_ld)[:, None]
    for m0 in range(0, n_rows, BM):
        slot = m0 + tl.arange(0, BM)
        valid = slot < n_rows
        if ROUTE:  # the slot-th assignment of expert e: its place in e's list is `slot`
            sel = (flat[None, :] == e) & (pos[None, :] == slot[:, None])  # [BM, A]
            rows = tl.sum(tl.where(sel, a[None, :], 0), axis=1)
        else:
            rows = tl.load(rows_ptr + e * T + slot, mask=valid, other=0)  # [BM] assignments t*k + j
        w_g, s_g, x_t, kw, kx = _v2_ptrs(
            w_ptr + e64 * stride_we,
            s_ptr + e64 * stride_se,
            x_ptr,
            n_ld,
            (rows // TOP_K).to(tl.int64) * stride_x,
            stride_wn,
            stride_sn,
            BM,
            BN,
            BK,
            SPLIT,
            False,
        )
        if SPLIT == 1:
            acc_g = tl.zeros([BN, BM], tl.float32)
        else:
            acc_g = tl.zeros([SPLIT, BN, BM], tl.float32)
        acc_u = tl.zeros_like(acc_g)
        for k0 in range(0, K, BK):
            xt = tl.load(x_t + k0, mask=_x_tile_ok(valid, kx, k0, K, SPLIT), other=0.0)
            acc_g = _v2_step(acc_g, xt, w_g, s_g, kw, k0, K, BN, BK, SPLIT, EVEN_K, PREC, ASM, False)
            acc_u = _v2_step(
                acc_u,
                xt,
                w_g + stride_wp,
                s_g + stride_sp,
                kw,
                k0,
                K,
                BN,
                BK,
                SPLIT,
                EVEN_K,
                PREC,
                ASM,
                False,
            )
        if SPLIT > 1:
            acc_g = tl.sum(acc_g, 0)
            acc_u = tl.sum(acc_u, 0)
        gate = tl.minimum(acc_g + b_g, limit)  # [BN, BM]
        up = tl.minimum(tl.maximum(acc_u + b_u, -limit), limit)
        act = (up + 1.0) * (gate * tl.sigmoid(alpha * gate))
        tl.store(
            act_ptr + (packed + slot).to(tl.int64)[None, :] * N + n[:, None],  # expert-packed rows
            act.to(act_ptr.dtype.element_ty),
            mask=(n < N)[:, None] & valid[None, :],
        )


@triton.jit(do_not_specialize=["T"])
def _down_dec_kernel(
    a_ptr,
    w_ptr,
    s_ptr,
    b_ptr,
    y_ptr,
    counts_ptr,
    rows_ptr,
    T,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    N: tl.constexpr,
    K: tl.constexpr,
    E: tl.constexpr,
    BE: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    SPLIT: tl.constexpr,
    PREC: tl.constexpr,
    ASM: tl.constexpr,
    PDL: tl.constexpr,
):
    """Program (column block, slot): y[rows of the slot's expert, block] = act @ W2_e^T + b2_e."""
    pdl.wait_then_release(PDL)
    pid_n, s = tl.program_id(0), tl.program_id(1)
    ex = tl.arange(0, BE)
    e, n_rows, packed = _slot_expert(tl.load(counts_ptr + ex, mask=ex < E, other=0), ex, s)
    if n_rows == 0:  # past the active experts
        return
    EVEN_K: tl.constexpr = K % BK == 0
    n = pid_n * BN + tl.arange(0, BN)
    n_ld = n % N
    e64 = e.to(tl.int64)
    bias = tl.load(b_ptr + e64 * N + n_ld)[:, None]  # [BN, 1]
    for m0 in range(0, n_rows, BM):
        slot = m0 + tl.arange(0, BM)
        valid = slot < n_rows
        rows = tl.load(rows_ptr + e * T + slot, mask=valid, other=0)  # [BM] assignments t*k + j
        w_t, s_t, a_t, kw, kx = _v2_ptrs(
            w_ptr + e64 * stride_we,
            s_ptr + e64 * stride_se,
            a_ptr,
            n_ld,
            (packed + slot).to(tl.int64) * K,  # expert-packed act rows
            stride_wn,
            stride_sn,
            BM,
            BN,
            BK,
            SPLIT,
            False,
        )
        if SPLIT == 1:
            acc = tl.zeros([BN, BM], tl.float32)
        else:
            acc = tl.zeros([SPLIT, BN, BM], tl.float32)
        for k0 in range(0, K, BK):
            at = tl.load(a_t + k0, mask=_x_tile_ok(valid, kx, k0, K, SPLIT), other=0.0)
            acc = _v2_step(acc, at, w_t, s_t, kw, k0, K, BN, BK, SPLIT, EVEN_K, PREC, ASM, False)
        if SPLIT > 1:
            acc = tl.sum(acc, 0)
        tl.store(
            y_ptr + rows.to(tl.int64)[None, :] * N + n[:, None],
            (acc + bias).to(y_ptr.dtype.element_ty),  # [BN, BM]
            mask=(n < N)[:, None] & valid[None, :],
        )


def gate_up_dec(
    x: Tensor,
    r: Routing,
    w: MoEWeights,
    alpha: float,
    limit: float,
    t: DecTiles,
    logits: Tensor | None = None,
) -> Tensor:
    """x [T, H] -> act [T*k, I], expert-packed: expert e's rows (in r.rows[e] order) start after
    those of the experts below e, so down finds them without loading r.rows. With logits [T, E], the
    kernel routes them itself and fills r's buffers (empty on entry) for down and the combine."""
    (n_tok, h), k = x.shape, r.ids.shape[1]
    e, _, i = w.shape
    act = common._empty((n_tok * k, i), x.dtype, x.device)
    s13 = w.s13.view(torch.int32)
    route = logits is not None
    _gate_up_dec_kernel[(triton.cdiv(i, t.bn), min(e, n_tok * k))](
        x,
        w.w13,
        s13,
        w.b13,
        act,
        r.counts,
        r.rows,
        logits if route else r.weights,
        r.ids,
        r.weights,
        n_tok,
        logits.stride(0) if route else 0,
        x.stride(0),
        *w.w13.stride()[:3],
        *s13.stride()[:3],
        alpha,
        limit,
        N=i,
        K=h,
        TOP_K=k,
        E=e,
        BE=triton.next_power_of_2(e),
        BM=t.bm,
        BN=t.bn,
        BK=t.bk,
        SPLIT=t.split,
        PREC=_precision(x),
        ASM=common._use_asm(x),
        ROUTE=route,
        KP=triton.next_power_of_2(k),
        BT=triton.next_power_of_2(n_tok) if route else 1,
        num_warps=t.warps,
        num_stages=t.stages,
        maxnreg=t.maxnreg,
        **pdl.args(x),
    )
    return act


def down_dec(act: Tensor, r: Routing, w: MoEWeights, t: DecTiles) -> Tensor:
    """act [T*k, I] (gate_up_dec's expert-packed rows) -> y [T*k, H] (rows t*k + j: moe.combine's input)."""
    n_tok, k = r.ids.shape
    e, h, i = w.shape
    y = common._empty((n_tok * k, h), act.dtype, act.device)
    s2 = w.s2.view(torch.int32)
    _down_dec_kernel[(triton.cdiv(h, t.bn), min(e, n_tok * k))](
        act,
        w.w2,
        s2,
        w.b2,
        y,
        r.counts,
        r.rows,
        n_tok,
        *w.w2.stride()[:2],
        *s2.stride()[:2],
        N=h,
        K=i,
        E=e,
        BE=triton.next_power_of_2(e),
        BM=t.bm,
        BN=t.bn,
        BK=t.bk,
        SPLIT=t.split,
        PREC=_precision(act),
        ASM=common._use_asm(act),
        num_warps=t.warps,
        num_stages=t.stages,
        **pdl.args(act),
    )
    return y


def experts_dec(
    x: Tensor,
    r: Routing,
    w: MoEWeights,
    alpha: float,
    limit: float,
    combined: bool = True,
    logits: Tensor | None = None,
) -> Tensor:
    """x [T, H] routed by r -> [T, H]: the two decode GEMMs and moe.combine. combined False returns
    the experts' rows y [T*k, H] instead, for a caller that fuses the combine into its next kernel
    (rmsnorm.fused_add_rms_norm's combine). With logits, gate_up routes them and fills r first."""
    from gptoss.kernels.moe import combine  # moe imports this module

    _, h, i = w.shape
    # BM follows T when compiled (the MMA pads BM to 8 columns and sums each alike: batch-invariant);
    # the interpreter's numpy matmul sums in a shape-dependent order, so there BM stays fixed.
    t = x.shape[0] if x.is_cuda and not triton.knobs.runtime.interpret else 1 << 30
    act = gate_up_dec(x, r, w, alpha, limit, dec_tiles(True, h, t), logits=logits)  # [T*k, I]
    y = down_dec(act, r, w, dec_tiles(False, i, t))  # [T*k, H]
    return combine(y, r.weights, x.dtype) if combined else y


def experts_dec_logits(
    x: Tensor, logits: Tensor, top_k: int, w: MoEWeights, alpha: float, limit: float
) -> tuple[Tensor, Routing]:
    """x [T, H], router logits [T, E] -> (y [T*k, H], Routing): experts_dec(combined=False) with the
    routing done inside the gate_up GEMM (no routing launch); the Routing's buffers hold
    route_and_group's decisions (each expert's rows in increasing order) once gate_up has run."""
    n_tok = x.shape[0]
    e = w.shape[0]
    if logits.shape != (n_tok, e) or logits.stride(-1) != 1 or not 1 <= top_k <= e:
        raise ValueError(
            f"experts_dec_logits: logits {tuple(logits.shape)} (contiguous rows) and top_k {top_k} "
            f"must fit x {tuple(x.shape)} and E = {e}"
        )
    r = Routing.empty(n_tok, top_k, e, x.device)
    return experts_dec(x, r, w, alpha, limit, combined=False, logits=logits), r


def moe_decode(
    x: Tensor,
    router_weight: Tensor,
    router_bias: Tensor,
    top_k: int,
    w: MoEWeights,
    alpha: float,
    limit: float,
) -> Tensor:
    """moe_forward for 0 < T <= MAX_T on bits weights: route, then experts_dec."""
    return experts_dec(x, route(x, router_weight, router_bias, top_k), w, alpha, limit)


def route(x: Tensor, router_weight: Tensor, router_bias: Tensor, top_k: int) -> Routing:
    """The decode router: F.linear (logits [T, E] in x.dtype, as the model) + route_and_group."""
    return route_and_group(F.linear(x, router_weight, router_bias), top_k)

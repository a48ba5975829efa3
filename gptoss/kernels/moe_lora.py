"""LoRA on the MXFP4 MoE kernels: the experts stay packed, the adapters' deltas run unmerged.

Per routed row a (token a // k through expert e), as gptoss.model.Experts with a LoraStep:

  s13 = mask_t * (x[a // k] @ A13_e^T)      [A, W]   _shrink_kernel (grouped by expert, like the GEMMs)
  act = swiglu(x @ W13_e^T + b13 + B13_e @ s13^T)    gptoss.kernels.moe gate_up, LORA=True: the expand
                                                     is one more dot in its epilogue, before the SwiGLU
  s2  = mask_t * (act[a] @ A2_e^T)          [A, W]   _shrink_kernel
  y   = act @ W2_e^T + b2 + B2_e @ s2^T              moe down, LORA=True, before the routing weights

W stacks every loaded adapter's rank columns (gptoss.lora_stack); mask_t keeps token t's adapter's
columns, from its adapter index, inside the shrink kernel, so one launch serves a batch that mixes
adapters and the base model, with no host sync (CUDA graphs capture it). The shrink is a small
grouped GEMM (K = H or I, N = W <= 256); the expand costs the GEMM programs one [BN, W] @ [W, BM]
dot, next to their K/BK dots of [BN, BK] @ [BK, BM]. The seed (vLLM's Triton fused-MoE LoRA for
MXFP4) has the same shape: it unfuses the activation and the sum of matmul_ogs to add the deltas.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from gptoss.kernels import moe_decode
from gptoss.kernels.moe import (
    MoEWeights,
    choose_tiles,
    choose_tiles_v2,
    combine,
    down,
    down_v2,
    gate_up,
    gate_up_v2,
)
from gptoss.kernels.moe_common import _empty, _expert_tile_at, _precision, _tile_rows
from gptoss.kernels.moe_layout import for_rows
from gptoss.kernels.moe_routing import Routing, route_and_group
from gptoss.kernels.moe_tiles import choose_tiles_v3, dec_tiles
from gptoss.kernels.moe_v3 import down_v3, gate_up_v3, pointer_down


@dataclass(frozen=True, slots=True)
class MoELora:
    """One layer's stacked expert adapters, laid out for the kernels; a target none adapts is None."""

    a13: Tensor | None  # [E, W, H]
    b13: Tensor | None  # [E, 2, I, W] contiguous: [:, 0] gate rows, [:, 1] up rows (as MoEWeights.b13)
    a2: Tensor | None  # [E, W, I]
    b2: Tensor | None  # [E, H, W]
    rank: int  # R: adapter i owns columns [(i-1) R, i R)


def prepare_moe_lora(experts: dict[str, tuple[Tensor, Tensor]], rank: int) -> MoELora | None:
    """gptoss.lora_stack.LayerLora.experts -> MoELora (None: no adapter adapts this layer's experts)."""
    if not experts:
        return None
    a13 = b13 = a2 = b2 = None
    if "gate_up_proj" in experts:
        a13, b = experts["gate_up_proj"]  # [E, W, H], [E, 2I, W] with gate/up rows interleaved
        e, n2, w = b.shape
        b13 = b.reshape(e, n2 // 2, 2, w).transpose(1, 2).contiguous()
        a13 = a13.contiguous()
    if "down_proj" in experts:
        a2, b2 = (t.contiguous() for t in experts["down_proj"])
    return MoELora(a13, b13, a2, b2, rank)


@triton.jit(do_not_specialize=["T"])
def _shrink_kernel(
    x_ptr,
    a_ptr,
    idx_ptr,
    s_ptr,
    counts_ptr,
    rows_ptr,
    T,
    K,
    stride_x,
    stride_ae,
    TOKEN_DIV: tl.constexpr,
    PACKED: tl.constexpr,
    TOP_K: tl.constexpr,
    E: tl.constexpr,
    BE: tl.constexpr,
    BM: tl.constexpr,
    BK: tl.constexpr,
    W: tl.constexpr,
    R: tl.constexpr,
    PREC: tl.constexpr,
):
    """s[a] = mask(a) * (x[a // TOKEN_DIV] @ A_e^T) for the rows a of tile pid_m; mask(a) keeps the
    columns of the adapter idx[a // TOP_K] (block (col // R) + 1; index 0, the base model: none).
    PACKED: x's rows are expert-packed (moe_decode's act: expert e's slots after the experts below e)."""
    pid_m = tl.program_id(0)
    e, slot0, n_rows, n_tiles = _expert_tile_at(counts_ptr, pid_m, E, BE, BM)
    if pid_m >= n_tiles:
        return
    rows, valid = _tile_rows(rows_ptr, T, e, slot0, n_rows, BM)
    if PACKED:
        ex = tl.arange(0, BE)
        cnt = tl.load(counts_ptr + ex, mask=ex < E, other=0)
        x_row = tl.sum(tl.where(ex < e, cnt, 0), 0) + slot0 + tl.arange(0, BM)
    else:
        x_row = rows // TOKEN_DIV
    kk = tl.arange(0, BK)
    w = tl.arange(0, W)
    x_rows = x_ptr + x_row.to(tl.int64)[:, None] * stride_x + kk[None, :]  # [BM, BK]
    a_cols = a_ptr + e.to(tl.int64) * stride_ae + w[None, :] * K + kk[:, None]  # [BK, W]
    acc = tl.zeros([BM, W], tl.float32)
    for k0 in range(0, K, BK):
        k_ok = k0 + kk < K
        xt = tl.load(x_rows + k0, mask=valid[:, None] & k_ok[None, :], other=0.0)
        at = tl.load(a_cols + k0, mask=k_ok[:, None], other=0.0)
        acc = tl.dot(xt, at, acc, input_precision=PREC)
    adapter = tl.load(idx_ptr + rows // TOP_K, mask=valid, other=0)  # [BM]
    own = (w // R + 1)[None, :] == adapter[:, None]  # [BM, W]
    acc = tl.where(own, acc, 0.0)
    tl.store(
        s_ptr + rows.to(tl.int64)[:, None] * W + w[None, :],
        acc.to(s_ptr.dtype.element_ty),
        mask=valid[:, None],
    )


def _routed_rows(token_div: int, packed: bool, k: int, e: int, w: int, rank: int) -> dict:
    """The constexprs both shrinks take: where a routed row's x row is; the routing's and stack's sizes."""
    return {
        "TOKEN_DIV": token_div,
        "PACKED": packed,
        "TOP_K": k,
        "E": e,
        "BE": triton.next_power_of_2(e),
        "W": w,
        "R": rank,
    }


def shrink(
    x: Tensor, a: Tensor, r: Routing, index: Tensor, rank: int, token_div: int, packed: bool = False
) -> Tensor:
    """Rows of x (row a // token_div for assignment a; packed: x holds expert-packed rows, as
    moe_decode's act) through their expert's stacked A [E, W, K], masked to their token's adapter
    -> s [T*k, W] in x.dtype, by assignment. index [T]: each token's adapter."""
    t, k = r.ids.shape
    e, w, kdim = a.shape
    s = _empty((t * k, w), x.dtype, x.device)
    bm = 64 if w <= 64 else 32 if w <= 128 else 16  # the [BM, W] accumulator stays in registers
    rows = t * k
    grid = (min(rows, (rows + min(e, rows) * (bm - 1)) // bm),)
    _shrink_kernel[grid](
        x,
        a,
        index,
        s,
        r.counts,
        r.rows,
        t,
        kdim,
        x.stride(0),
        a.stride(0),
        BM=bm,
        BK=64,
        **_routed_rows(token_div, packed, k, e, w, rank),
        PREC=_precision(x),
        num_warps=4,
    )
    return s


@triton.jit(do_not_specialize=["T"])
def _gather_kernel(
    full_ptr,
    idx_ptr,
    s_ptr,
    counts_ptr,
    rows_ptr,
    T,
    stride_f,
    TOKEN_DIV: tl.constexpr,
    PACKED: tl.constexpr,
    TOP_K: tl.constexpr,
    E: tl.constexpr,
    BE: tl.constexpr,
    W: tl.constexpr,
    R: tl.constexpr,
):
    """Program p, the p-th routed row in expert order (expert e's rows after those of the experts
    below e, as moe_decode packs act), with its expert e and assignment a:
    s[a] = mask(a) * full[row, e W : (e + 1) W], row p (PACKED) or a // TOKEN_DIV."""
    p = tl.program_id(0)
    ex = tl.arange(0, BE)
    cnt = tl.load(counts_ptr + ex, mask=ex < E, other=0)
    ends = tl.cumsum(cnt, 0)  # inclusive
    e = tl.sum((ends <= p).to(tl.int32), 0)
    start = tl.sum(tl.where(ex == e, ends - cnt, 0), 0)
    a = tl.load(rows_ptr + e * T + (p - start))
    row = p if PACKED else a // TOKEN_DIV
    w = tl.arange(0, W)
    adapter = tl.load(idx_ptr + a // TOP_K)
    v = tl.load(full_ptr + row.to(tl.int64) * stride_f + e * W + w)
    v = tl.where(w // R + 1 == adapter, v, 0.0)
    tl.store(s_ptr + a.to(tl.int64) * W + w, v.to(s_ptr.dtype.element_ty))


def shrink_dense(
    x: Tensor, a: Tensor, r: Routing, index: Tensor, rank: int, token_div: int, packed: bool = False
) -> Tensor:
    """shrink for decode sizes: every row of x through every expert's A at once on cuBLAS ([rows, K]
    @ [K, E*W]: all of A read once, 2.9 MB at 20b rank 16), then one program per routed row gathers
    its expert's W columns, masked to its token's adapter. Same arguments and result as shrink."""
    t, k = r.ids.shape
    e, w, kdim = a.shape
    full = F.linear(x, a.view(e * w, kdim))  # [rows of x, E*W] in x.dtype, as shrink rounds
    s = _empty((t * k, w), x.dtype, x.device)
    _gather_kernel[(t * k,)](
        full,
        index,
        s,
        r.counts,
        r.rows,
        t,
        full.stride(0),
        **_routed_rows(token_div, packed, k, e, w, rank),
        num_warps=1,
    )
    return s


# The decode-size shrink (experts_dec_lora). grouped: shrink, whose programs (one an expert's tile
# of rows) walk all K in 64-wide steps, one after another: 16.6 us a call on the H100 at T 16 (20b,
# rank 16; 2026-11-26: 10 % of a LoRA decode step). A program per routed row summing [W, 512] tiles
# without tl.dot was slower (24.8 us: its loads are not pipelined). dense: shrink_dense, when E*W
# <= DENSE_MAX_COLS (A stays a few MB).
LORA_SHRINK = os.environ.get("GPTOSS_LORA_SHRINK", "dense")
DENSE_MAX_COLS = 1024


def _decode_shrink(
    x: Tensor, a: Tensor, r: Routing, index: Tensor, rank: int, token_div: int, packed: bool = False
) -> Tensor:
    dense = LORA_SHRINK == "dense" and a.shape[0] * a.shape[1] <= DENSE_MAX_COLS
    return (shrink_dense if dense else shrink)(x, a, r, index, rank, token_div, packed)


def moe_forward_lora(
    x: Tensor,
    router_weight: Tensor,
    router_bias: Tensor,
    top_k: int,
    w: MoEWeights,
    lora: MoELora,
    index: Tensor,
    alpha: float,
    limit: float,
) -> Tensor:
    """gptoss.kernels.moe.moe_forward plus the LoRA deltas of each token's adapter (index [T]: 0 none)."""
    e, h, i = w.shape
    x = x.contiguous()
    t = x.shape[0]
    if t == 0:
        return torch.empty_like(x)
    r = route_and_group(F.linear(x, router_weight, router_bias), top_k)
    if moe_decode.use_decode(x, w):
        return combine(experts_dec_lora(x, r, w, lora, index, alpha, limit), r.weights, x.dtype)
    w = for_rows(w, t, top_k)
    lora13 = None if lora.a13 is None else (lora.b13, shrink(x, lora.a13, r, index, lora.rank, top_k))
    if w.layout == "bits":
        act = gate_up_v2(x, r, w, alpha, limit, choose_tiles_v2(t, top_k, e, i, h, gate_up=True), lora13)
    elif w.layout in ("v3", "v3ds"):
        act = gate_up_v3(x, r, w, alpha, limit, choose_tiles_v3(t, top_k, e, i, h, gate_up=True), lora13)
    else:
        act = gate_up(x, r, w, alpha, limit, choose_tiles(t, top_k, e, i, h, gate_up=True), lora13)
    lora2 = None if lora.a2 is None else (lora.b2, shrink(act, lora.a2, r, index, lora.rank, 1))
    if w.layout == "bits":
        y = down_v2(act, r, w, choose_tiles_v2(t, top_k, e, h, i, gate_up=False), lora2)
    elif w.layout in ("v3", "v3ds"):
        dn = choose_tiles_v3(t, top_k, e, h, i, gate_up=False, cp_async=pointer_down(act, w))
        y = down_v3(act, r, w, dn, lora2)
    else:
        y = down(act, r, w, choose_tiles(t, top_k, e, h, i, gate_up=False), lora2)
    return combine(y, r.weights, x.dtype)


def experts_dec_lora(
    x: Tensor, r: Routing, w: MoEWeights, lora: MoELora, index: Tensor, alpha: float, limit: float
) -> Tensor:
    """moe_decode.experts_dec(combined=False) plus the LoRA deltas: x [T, H] routed by r -> the
    experts' rows y [T*k, H]. The expand runs in the decode GEMMs' epilogues (T <= moe_decode.MAX_T),
    so a LoRA decode step streams the weights as the base model's does."""
    _, h, i = w.shape
    t, k = moe_decode.tiles_t(x), r.ids.shape[1]
    lora13 = None if lora.a13 is None else (lora.b13, _decode_shrink(x, lora.a13, r, index, lora.rank, k))
    act = moe_decode.gate_up_dec(x, r, w, alpha, limit, dec_tiles(True, h, t), lora=lora13)
    lora2 = None if lora.a2 is None else (lora.b2, _decode_shrink(act, lora.a2, r, index, lora.rank, 1, True))
    return moe_decode.down_dec(act, r, w, dec_tiles(False, i, t), lora=lora2)

"""MXFP4 mixture of experts in Triton: routing, two grouped GEMMs (MXFP4 -> bf16 in-kernel), combine.

moe_forward(x [T, H]) = sum over the token's k experts of w_k * expert_k(x), as gptoss.model.MoE:

  logits = x @ router^T + b                        [T, E]   torch F.linear
  route_and_group                                  [T, k] ids/weights, per-expert row lists
  act = swiglu(x_rows @ W13_e^T + b13_e)           [A, I]   A = T*k rows, _gate_up_kernel
  y   = act @ W2_e^T + b2_e                        [A, H]   _down_kernel, in x.dtype
  out[t] = sum_j w[t, j] * y[t*k + j]  (float32)   [T, H]   _combine_kernel, deterministic

Both GEMMs tile every expert's rows into BM-row tiles; program (n, m) finds its expert and rows
from the per-expert counts (E ints, a cumsum in registers), so grids depend on T and the shapes
only and programs past the last tile exit: no host sync, capturable in a CUDA graph. Each
program computes acc^T [BN, BM] = W [BN, BK] @ x_rows^T [BK, BM]: the dequantized weights are
the register operand and the few token rows the narrow one, so decode (BM = 16) still feeds
the tensor cores; the weights stay packed in HBM and are read 16 bytes at a time along K.

Two kernel families, chosen by the weights' layout (prepare_moe_weights(kernels=...), default the
module's KERNELS): v1 (_gate_up_kernel, _down_kernel) reads the checkpoint's nibble order; v2
(_gate_up_v2_kernel, _down_v2_kernel, the default) reads the bits of every 4-byte word rearranged
at load (_to_bits_layout) so that a rotate and a mask put two e2m1 codes at their bf16 positions,
and one bf16x2 multiply by 2^(s - 1) finishes both: ~1.7 instructions a weight, against ~4 for
v1's nibble shuffles, which bound the decode kernels (an SM must dequantize ~23 values a cycle to
keep up with 3 TB/s). v2 also loads the scales as int32 words through the cp.async pipeline (v1's
byte loads are not pipelined: issued and waited for in the same K step) and, at decode, splits
each K step over 4 warps (a 3D dot, summed once at the end) for 4x the resident warps.
USE_ASM (gptoss.kernels.moe_common) and TILE_OVERRIDE (moe_tiles) switch the rest at call time.
prepare_moe_weights(large="v3") adds a v3 copy that batches of >= LARGE_MIN_ROWS rows an expert
run (moe_layout.for_rows): since v21 every batch the decode kernels (v2 layout, T <= 16) leave.
Files: moe_layout (weights), moe_tiles (block sizes), moe_common (switches, shared helpers),
moe_v1, moe_v2 and moe_v3 (the GEMM families; moe_v2_step and moe_v3_step their K steps), moe_decode,
moe_routing, moe_lora; this one the forward and combine (moe_rows: the forward without its
combine, which the engine's next add + RMSNorm does).

Work per forward, with d distinct experts hit (20b: H = I = 2880, E = 32, k = 4):
  gate_up  FLOPs 4*A*H*I; weight bytes d * (2I*H/2 + 2I*H/32) = d * 8.8 MB
  down     FLOPs 2*A*I*H; weight bytes d * (H*I/2 + H*I/32)   = d * 4.4 MB
  activations: x T*H, act A*I and y A*H (written, then read), out T*H, 2 bytes each.
Decode (T <= 16) is bound by the d * 13.2 MB of weights; large T by the FLOPs.

Small T on bits weights (gptoss.kernels.moe_decode: ENABLED, MAX_T) takes F.linear + route_and_group,
expert-slot GEMMs and combine; moe_forward_from_logits takes the GEMMs after route_and_group.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from gptoss.kernels import l2_prefetch, moe_decode, moe_v3, moe_v3_dec, moe_v3_dec_gu, pdl
from gptoss.kernels import moe_common as common
from gptoss.kernels.moe_layout import (  # noqa: F401 - the weights API, re-exported
    _BIT_FROM,
    _E2M1_TO_BF16_BIT,
    _ROTATE,
    KERNELS,
    MAX_SCALE_V2,
    MoEWeights,
    _to_bits_layout,
    for_rows,
    prepare_moe_weights,
)
from gptoss.kernels.moe_routing import Routing, route, route_and_group  # noqa: F401
from gptoss.kernels.moe_tiles import (  # noqa: F401
    DECODE_MAX_T,
    TILE_OVERRIDE,
    Tiles,
    _grid,
    choose_tiles,
    choose_tiles_v2,
    choose_tiles_v3,
)
from gptoss.kernels.moe_v1 import down, gate_up
from gptoss.kernels.moe_v2 import down_v2, gate_up_v2
from gptoss.kernels.moe_v2_step import _BITS_TO_BF16_ASM, _dequant_bits  # noqa: F401 - for tests and bench
from gptoss.kernels.moe_v3 import down_v3, gate_up_v3
from gptoss.kernels.rmsnorm import combine_rows

__all__ = ["MoEWeights", "moe_forward", "moe_forward_from_logits", "prepare_moe_weights", "route"]


@triton.jit
def _combine_kernel(y_ptr, w_ptr, out_ptr, H, TOP_K: tl.constexpr, BH: tl.constexpr, PDL: tl.constexpr):
    """out[t] = sum_j w[t, j] * y[t*k + j] in float32, in slot order (no atomics: deterministic)."""
    pdl.wait_then_release(PDL)
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BH + tl.arange(0, BH)
    h_ok = h < H
    acc = combine_rows(y_ptr, w_ptr, t, h, h_ok, H, TOP_K, BH)
    tl.store(out_ptr + t * H + h, acc.to(out_ptr.dtype.element_ty), mask=h_ok)


def combine(y: Tensor, weights: Tensor, dtype: torch.dtype) -> Tensor:
    """y [T*k, H], weights [T, k] -> [T, H] in dtype."""
    t, k = weights.shape
    h = y.shape[1]
    out = common._empty((t, h), dtype, y.device)
    bh = min(1024, triton.next_power_of_2(h))
    _combine_kernel[(t, triton.cdiv(h, bh))](y, weights, out, h, TOP_K=k, BH=bh, num_warps=4, **pdl.args(y))
    return out


def moe_forward(
    x: Tensor,
    router_weight: Tensor,
    router_bias: Tensor,
    top_k: int,
    w: MoEWeights,
    alpha: float,
    limit: float,
) -> Tensor:
    """x [T, H] -> [T, H] in x.dtype; gptoss.model.MoE.forward on the GPU kernels."""
    y, weights = moe_rows(x, router_weight, router_bias, top_k, w, alpha, limit)
    return y if weights is None else combine(y, weights, x.dtype)


def moe_rows(
    x: Tensor,
    router_weight: Tensor,
    router_bias: Tensor,
    top_k: int,
    w: MoEWeights,
    alpha: float,
    limit: float,
) -> tuple[Tensor, Tensor | None]:
    """moe_forward before its combine: (the experts' rows y [T*k, H], the routing weights [T, k]) for
    a next add + RMSNorm to combine (rmsnorm.fused_add_rms_norm(combine=...), the same bits as
    combine); decode sizes on the bits layout return moe_forward's [T, H] and None (combined already)."""
    e, h, i = w.shape
    if x.dim() != 2 or x.shape[1] != h or router_weight.shape != (e, h):
        raise ValueError(
            f"moe_forward: x {tuple(x.shape)}, router {tuple(router_weight.shape)} do not "
            f"match the experts (E={e}, H={h}, I={i})"
        )
    _need_triton(x)
    x = x.contiguous()
    if x.shape[0] == 0:
        return torch.empty_like(x), None
    if moe_decode.use_decode(x, w):
        return moe_decode.moe_decode(x, router_weight, router_bias, top_k, w, alpha, limit), None
    # The router GEMM and the routing in one launch lost 1-3 % of the whole MoE at T 256-16,384 on an
    # H100 (bench/results v71: its K loop is latency-bound, no faster than cuBLAS + route_and_group)
    r = route_and_group(F.linear(x, router_weight, router_bias), top_k)
    return _expert_rows(x, r, w, alpha, limit), r.weights


def moe_forward_from_logits(
    x: Tensor, logits: Tensor, top_k: int, w: MoEWeights, alpha: float, limit: float
) -> Tensor:
    """x [T, H], router logits [T, E] -> [T, H]: moe_forward after its router (vLLM's plugin enters here)."""
    e, h, i = w.shape
    if x.dim() != 2 or x.shape[1] != h or logits.shape != (x.shape[0], e):
        raise ValueError(
            f"moe_forward: x {tuple(x.shape)}, logits {tuple(logits.shape)} do not match the "
            f"experts (E={e}, H={h}, I={i})"
        )
    _need_triton(x)
    x = x.contiguous()
    if x.shape[0] == 0:
        return torch.empty_like(x)
    r = route_and_group(logits, top_k)
    if moe_decode.use_decode(x, w):
        return moe_decode.experts_dec(x, r, w, alpha, limit)
    return combine(_expert_rows(x, r, w, alpha, limit), r.weights, x.dtype)


def _need_triton(x: Tensor) -> None:
    if not (x.is_cuda or triton.knobs.runtime.interpret):
        raise RuntimeError(
            "moe_forward runs Triton kernels: it needs CUDA tensors (or TRITON_INTERPRET=1); "
            "on CPU use gptoss.model.MoE"
        )


def _expert_rows(x: Tensor, r: Routing, w: MoEWeights, alpha: float, limit: float) -> Tensor:
    """x [T, H] (contiguous; a batch moe_decode.use_decode leaves) routed by r -> y [T*k, H] on the
    GEMM family of w's layout (the large-batch copy where one suits T)."""
    (t, _), (e, h, i), top_k = x.shape, w.shape, r.ids.shape[1]
    w = for_rows(w, t, top_k)  # the large-batch copy (MoEWeights.large) from LARGE_MIN_ROWS rows an expert
    if w.layout == "bits":
        act = gate_up_v2(x, r, w, alpha, limit, choose_tiles_v2(t, top_k, e, i, h, gate_up=True))
        return down_v2(act, r, w, choose_tiles_v2(t, top_k, e, h, i, gate_up=False))
    if w.layout in ("v3", "v3ds"):
        return expert_rows_v3(x, r, w, alpha, limit)
    act = gate_up(x, r, w, alpha, limit, choose_tiles(t, top_k, e, i, h, gate_up=True))
    return down(act, r, w, choose_tiles(t, top_k, e, h, i, gate_up=False))


def v3_decode(x: Tensor, w: MoEWeights) -> bool:
    """Whether x [T, H] is a decode batch (T <= moe_tiles.DECODE_MAX_T) on one v3 copy of the experts
    (120b's default): the engine then takes expert_rows_v3_logits (the gate_up routes the logits) and
    fuses the combine into its next add + RMSNorm, as on the decode kernels."""
    return w.layout in ("v3", "v3ds") and 0 < x.shape[0] <= DECODE_MAX_T


def expert_rows_v3(
    x: Tensor, r: Routing, w: MoEWeights, alpha: float, limit: float, logits: Tensor | None = None
) -> Tensor:
    """x [T, H] routed by r -> the experts' rows y [T*k, H] (combine's input) on the v3 GEMMs. With
    logits [T, E] (a decode batch: v3_decode), gate_up routes them itself and fills r (empty).
    A decode batch of moe_v3_dec.TOKENS tokens on "v3" weights (act in assignment order) runs its
    down on the split-K slot kernel, moe_v3_dec.down_v3_dec; of moe_v3_dec_gu.TOKENS tokens, its
    gate_up on the split-K gate_up, moe_v3_dec_gu.gate_up_v3_dec. One token routed in the kernel
    with GPTOSS_L2_PREFETCH's "moe" takes v3's gate_up instead, which warms L2 with the down's
    weights (gate_up_v3's prefetch_down; a token's 4 experts fit L2, a batch's do not; the split-K
    gate_up has no prefetch)."""
    if w.layout not in ("v3", "v3ds"):
        raise ValueError(f"expert_rows_v3: weights in the {w.layout!r} layout, not v3 or v3ds")
    (t, _), (e, h, i), k = x.shape, w.shape, r.ids.shape[1]
    srt, tx = moe_v3.tma_plan(x) if logits is None else (False, False)
    pf = "moe" in l2_prefetch.ON and t == 1 and logits is not None
    if t in moe_v3_dec_gu.TOKENS and w.layout == "v3" and not srt and not pf:
        act = moe_v3_dec_gu.gate_up_v3_dec(x, r, w, alpha, limit, logits=logits)
    else:
        gu = choose_tiles_v3(t, k, e, i, h, gate_up=True)
        act = gate_up_v3(
            x, r, w, alpha, limit, gu, sorted_rows=srt, tma_x=tx, logits=logits, prefetch_down=pf
        )
    if t in moe_v3_dec.TOKENS and w.layout == "v3" and not srt:
        return moe_v3_dec.down_v3_dec(act, r, w)
    dn = choose_tiles_v3(t, k, e, h, i, gate_up=False, cp_async=moe_v3.pointer_down(act, w))
    return down_v3(act, r, w, dn, sorted_rows=srt)


def expert_rows_v3_logits(
    x: Tensor, logits: Tensor, top_k: int, w: MoEWeights, alpha: float, limit: float
) -> tuple[Tensor, Routing]:
    """x [T, H], router logits [T, E] (a decode batch: v3_decode) -> (y [T*k, H], Routing): no
    routing launch; the Routing's buffers hold route_and_group's decisions once gate_up has run."""
    r = Routing.empty(x.shape[0], top_k, w.shape[0], x.device)
    return expert_rows_v3(x, r, w, alpha, limit, logits=logits), r

"""The MoE at decode batch sizes (T <= MAX_T): expert-slot GEMMs on the bits layout.

moe_decode(x, router, ...) = moe_forward for small T, in 5 launches:

  router              F.linear + route_and_group (or, experts_dec_logits: no routing launch, the
                      gate_up kernel routes the logits itself, ROUTE; the engine's GPTOSS_ROUTER=fused
                      takes the logits from norm_route.norm_logits, fused with the add + RMSNorm)
  _gate_up_dec_kernel act = swiglu(x_rows @ W13_e^T + b13_e)   grid (I / BN, slots)
  _down_dec_kernel    y = act @ W2_e^T + b2_e per slot         grid (H / BN, slots)
  moe.combine         out[t] = sum over t's k rows of w * y

With LoRA adapters (moe_lora.experts_dec_lora) both GEMMs add the expand B_e @ s^T in their
epilogue (gate_up before the SwiGLU), s the routed rows' shrunk input, so a LoRA decode step streams
the experts as the base model's does.

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
from torch import Tensor

from gptoss.kernels import moe_common as common
from gptoss.kernels import moe_decode_flat as flat
from gptoss.kernels import pdl
from gptoss.kernels.device_info import sm_count
from gptoss.kernels.moe_common import _precision
from gptoss.kernels.moe_decode_kernels import _down_dec_kernel, _gate_up_dec_kernel
from gptoss.kernels.moe_layout import MoEWeights
from gptoss.kernels.moe_routing import Routing, route_and_group
from gptoss.kernels.moe_tiles import DecTiles, dec_tiles

ENABLED = True  # moe_forward / moe_forward_from_logits take this path for 0 < T <= MAX_T on bits weights
MAX_T = 16  # T*k/E <= 2 rows an expert on average at 20b; past it v2's M tiles amortize the weights


def use_decode(x: Tensor, w: MoEWeights) -> bool:
    """Whether moe_forward takes this path for x [T, H] on w."""
    return ENABLED and w.layout == "bits" and 0 < x.shape[0] <= MAX_T


# Whether the decode GEMMs launch with PDL (module switches for bench/decode_ab_gpu.py, default on as
# timed so far). At 120b on the v3 copy, launching the MoE GEMMs of a decode layer with PDL cost a
# lot: gate_up 727 -> 1,312 us a token, the down 322 -> 409 when gate_up released it early (bench/
# results v36). These kernels (20b's batch 1) launch with PDL and are untimed without it.
PDL_GATE_UP = True
PDL_DOWN = True


PROBE = 0  # benchmarks only: the slot kernels' load-only (1) or compute-only (2) K step (moe_v2_step)
SMS_OFF_GPU = 3  # the interpreter's "SMs": a flat grid of a few programs, so tests cross experts


def _sms(x: Tensor) -> int:
    if common.compiled(x):
        return sm_count(x)
    return SMS_OFF_GPU


def _kernel_grid(slot_kernel, flat_kernel, t: DecTiles, n: int, slots: int, x: Tensor):
    """(kernel, grid, its own arguments): the slot kernel on (column blocks, slots), or with t.per_sm
    the flat one on a fixed grid (whole column blocks only: n % BN == 0)."""
    blocks = triton.cdiv(n, t.bn)
    if t.per_sm and n % t.bn == 0:
        return flat_kernel, (flat.programs(blocks * slots, _sms(x), t.per_sm),), {}
    return slot_kernel, (blocks, slots), {"PROBE": PROBE}


def gate_up_dec(
    x: Tensor,
    r: Routing,
    w: MoEWeights,
    alpha: float,
    limit: float,
    t: DecTiles,
    logits: Tensor | None = None,
    lora: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """x [T, H] -> act [T*k, I], expert-packed: expert e's rows (in r.rows[e] order) start after
    those of the experts below e, so down finds them without loading r.rows. With logits [T, E], the
    kernel routes them itself and fills r's buffers (empty on entry) for down and the combine.
    lora (B planes [E, 2, I, W], s [T*k, W] by assignment; moe_lora) adds the LoRA expand."""
    if lora is not None and logits is not None:
        raise ValueError("gate_up_dec: a LoRA shrink needs the routing first; pass r, not logits")
    (n_tok, h), k = x.shape, r.ids.shape[1]
    e, _, i = w.shape
    act = common._empty((n_tok * k, i), x.dtype, x.device)
    s13 = w.s13.view(torch.int32)
    route = logits is not None
    largs, lkw = common._lora_args(lora, x, planes=True)
    kernel, grid, own = _kernel_grid(
        _gate_up_dec_kernel, flat._gate_up_flat_kernel, t, i, min(e, n_tok * k), x
    )
    kernel[grid](
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
        *largs,
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
        **lkw,
        num_warps=t.warps,
        num_stages=t.stages,
        maxnreg=t.maxnreg,
        **pdl.args(x, PDL_GATE_UP),
        **own,
    )
    return act


def down_dec(
    act: Tensor, r: Routing, w: MoEWeights, t: DecTiles, lora: tuple[Tensor, Tensor] | None = None
) -> Tensor:
    """act [T*k, I] (gate_up_dec's expert-packed rows) -> y [T*k, H] (rows t*k + j: moe.combine's input).
    lora (B [E, H, W], s [T*k, W] by assignment) adds the LoRA expand."""
    n_tok, k = r.ids.shape
    e, h, i = w.shape
    y = common._empty((n_tok * k, h), act.dtype, act.device)
    s2 = w.s2.view(torch.int32)
    largs, lkw = common._lora_args(lora, act, planes=False)
    kernel, grid, own = _kernel_grid(_down_dec_kernel, flat._down_flat_kernel, t, h, min(e, n_tok * k), act)
    kernel[grid](
        act,
        w.w2,
        s2,
        w.b2,
        y,
        r.counts,
        r.rows,
        *largs,
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
        **lkw,
        num_warps=t.warps,
        num_stages=t.stages,
        **pdl.args(act, PDL_DOWN),
        **own,
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
    t = tiles_t(x)
    act = gate_up_dec(x, r, w, alpha, limit, dec_tiles(True, h, t), logits=logits)  # [T*k, I]
    y = down_dec(act, r, w, dec_tiles(False, i, t))  # [T*k, H]
    return combine(y, r.weights, x.dtype) if combined else y


def tiles_t(x: Tensor) -> int:
    """The T that dec_tiles sizes BM by. BM follows T when compiled (the MMA pads BM to 8 columns and
    sums each alike: batch-invariant); the interpreter's numpy matmul sums in a shape-dependent order,
    so there BM stays fixed."""
    return x.shape[0] if common.compiled(x) else 1 << 30


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

"""The v3 MoE GEMMs for large batches, acc^T [BN, BM] = W [BN, BK] @ x^T [BK, BM] on wgmma with the
weights as its register operand, in two weight layouts (gptoss.kernels.moe_layout):

  "v3"   (SWZ): each 16-row x 64-K block of W stored as the 32 lanes' MMA fragments, 16 bytes a lane
         (_to_v3_layout), in v2's bits order; the kernel loads int32 words, dequantizes them with
         v2's rotate-and-mask (two scale factors a word: its rows g and g + 8) and a permute +
         reshape that is the identity on registers, so the tile is already in the wgmma operand
         layout: no convert_layout through shared memory in the K loop (checked in the sm_90a TTGIR).
  "v3ds" checkpoint nibble order, tl.dot_scaled(w, s, "e2m1", x, None, "bf16"), the simplest
         version: Triton 3.6 upcasts through a byte-wise LDS of the packed tile and a PRMT table,
         converts the scales through shared memory and waits for every wgmma; ~7 SASS a weight value
         a thread in the K loop at BK 64, ~9 at BK 128 (K 2880's masked tail leaves the x and weight
         loads out of the cp.async pipeline), against v2's ~5.5 and SWZ's ~3.7-4.1 (sm_90a, 20b).

gate_up's W13 comes with gate and up rows interleaved by 8 in both layouts (moe_layout._interleave8):
a program's 2*BN weight rows are one dot, and the wgmma accumulator holds gate row 8b + g and its up
row in one thread (rows g and g + 8 of a fragment), so the SwiGLU pairs them in registers. One dot
of 2*BN rows instead of two of BN lets a warpgroup own 64 rows at half the columns: 8 warps reach
BM 256 at 128 accumulator registers a thread (a tile per expert up to 256 rows: each weight
dequantized once where BM 128 passes twice). Tiles.half: a tile with <= BM/2 rows runs a BM/2 body.
"""

from __future__ import annotations

import os
import warnings

import torch
import triton
from torch import Tensor
from triton.tools.tensor_descriptor import TensorDescriptor

from gptoss.kernels import l2_prefetch, pdl
from gptoss.kernels import moe_common as common
from gptoss.kernels.moe_common import _lora_args, _precision
from gptoss.kernels.moe_layout import MoEWeights
from gptoss.kernels.moe_routing import Routing
from gptoss.kernels.moe_tiles import Tiles, _grid
from gptoss.kernels.moe_v3_down import _down_v3_kernel
from gptoss.kernels.moe_v3_kernels import _gate_up_v3_kernel, _gather_sorted_kernel

# GPTOSS_MOE_V3_TMA (experiments, off): =down, gate_up writes act expert by expert and down reads its
# act tiles by TMA (no per-row addresses); =all, gate_up's x too, after a pass that lays x's rows out
# expert by expert; =x, gate_up's x alone (act in assignment order), aimed at the x gather's per-row
# cp.async addressing that v20's stall samples and v64's Nsight Compute (M 1024) pointed at. Each gave
# other values than the gather path compiled (=down / =all on an H200, v29 and v56: the last columns
# of a row; =x on an H100 with the engine's weights by TMA, v69) and =x no speed (M 256-4096 0.96-1.04x):
# strict xfails in test_moe_v3_tma.py, and choosing one warns.
_TMA_MODES = {"0": (False, False), "down": (True, False), "all": (True, True), "x": (False, True)}


def _tma_mode(v: str) -> tuple[bool, bool]:
    if v not in _TMA_MODES:
        raise ValueError(f"GPTOSS_MOE_V3_TMA={v!r}: one of {', '.join(_TMA_MODES)}")
    if v != "0":
        warnings.warn(
            f"GPTOSS_MOE_V3_TMA={v}: an experiment that gives other values than the gather path on the "
            "GPU (bench/results v29, v56, v69); leave it unset for real runs",
            RuntimeWarning,
            stacklevel=2,
        )
    return _TMA_MODES[v]


TMA_DOWN, TMA_X = _tma_mode(os.environ.get("GPTOSS_MOE_V3_TMA", "0"))


def _wtma_switch(v: str) -> str:
    if v not in ("0", "1", "auto"):
        raise ValueError(f"GPTOSS_MOE_V3_WTMA={v!r}: 0, 1 or auto")
    return v


# Weights by TMA: both GEMMs load their weight and scale words with one TMA copy a K step (issued by
# one thread: no per-lane addresses, chunks past K zero-filled) instead of a 16-byte cp.async a lane;
# the same bits. H200, 120b, whole MoE in a CUDA graph (bench/results v29): M 1 / 16 / 256 / 512 /
# 1024 56.6 / 244.3 / 651.7 / 829.2 / 1095.2 -> 54.0 / 230.8 / 540.3 / 739.9 / 1027.5 us; Offline 1000
# x (1024 -> 1278) 9,507.7 -> 10,213.0 tok/s, batch 1 328 -> 334. Those are tiles of <= 128 rows; 20b's
# BM-256 tiles are untimed with it (a K step 218 instructions, not 172, in the sm_90a SASS), so
# "auto" (the default) takes TMA for tiles of BM <= 128; 1 for every tile, 0 never.
TMA_W = _wtma_switch(os.environ.get("GPTOSS_MOE_V3_WTMA", "auto"))


# GPTOSS_V3_ROUTE_PDL=1: the gate_up that routes the logits itself (a decode batch, the kernel after
# norm_logits) launches with PDL, as the other kernels of a decode layer do: its programs are placed
# while norm_logits runs, and its release lets the down (a PDL kernel) be placed during gate_up. Off:
# 120b batch 1 on an H200 (bench/results v36) fell from 383.8 to 297.9 tok/s with it, gate_up 726 ->
# 1,322 us a token and the down 322 -> 413 (moe_v3_dec_gu.LAUNCH_PDL says why).
ROUTE_PDL = common.env_switch("GPTOSS_V3_ROUTE_PDL", "0")


def _tma_runs(x: Tensor) -> bool:
    """Whether TMA copies run for x's kernels: Hopper and later, or the interpreter."""
    return triton.knobs.runtime.interpret or (
        x.is_cuda and torch.cuda.get_device_capability(x.device)[0] >= 9
    )


def weight_words(blocks: Tensor, scales: Tensor) -> tuple[Tensor, Tensor]:
    """The "v3" words [E, N, Kp/2] uint8 and scales [E, N, Kp/32] (contiguous, N % 16 == 0, whole 64-K
    chunks) viewed as int32 words [E*N/16, Kp/64, 128] and scale words [E*N/16, Kp/64, 8]: each
    16-row block's 64-K chunk is one row of 128 words and one of 8."""
    e, n, kb = blocks.shape
    words = blocks.view(torch.int32).reshape(e * n // 16, kb // 32, 128)
    return words, scales.reshape(-1).view(torch.int32).reshape(e * n // 16, kb // 32, 8)


def weight_descriptors(blocks: Tensor, scales: Tensor, rows: int, bk: int) -> dict:
    """The "v3" words [E, N, Kp/2] uint8 and scales [E, N, Kp/32] as TMA descriptors for the kernels'
    WTMA: words [E*N/16, Kp/64, 128] int32 in blocks [rows/16, BK/64, 128], scale words
    [E*N/16, Kp/64, 8] in blocks [rows/16, BK/64, 8] (each 16-row block is contiguous in both)."""
    e, n, kb = blocks.shape
    if n % 16 or kb % 32 or rows % 16 or bk % 64 or not (blocks.is_contiguous() and scales.is_contiguous()):
        raise ValueError(
            f"weight_descriptors: contiguous v3 words with N % 16 == 0 and whole 64-K chunks, rows % 16 == 0 "
            f"and BK % 64 == 0, got words {tuple(blocks.shape)}, rows {rows}, BK {bk}"
        )
    words, s_words = weight_words(blocks, scales)
    return {
        "w_desc": TensorDescriptor.from_tensor(words, [rows // 16, bk // 64, 128]),
        "s_desc": TensorDescriptor.from_tensor(s_words, [rows // 16, bk // 64, 8]),
        "WTMA": True,
    }


def _wtma_on(x: Tensor, swz: bool, bm: int) -> bool:
    """Whether a GEMM of BM-row tiles takes its weight words by TMA: TMA_W takes the tiles ("1": all;
    "auto": BM <= 128), the layout is "v3" (swz) and TMA runs for x; else the cp.async path."""
    return (TMA_W == "1" or (TMA_W == "auto" and bm <= 128)) and swz and _tma_runs(x)


def _wtma_args(x: Tensor, blocks: Tensor, scales: Tensor, swz: bool, rows: int, tiles: Tiles) -> dict:
    """A GEMM's weight-TMA arguments where _wtma_on; else none (the cp.async path)."""
    if not _wtma_on(x, swz, tiles.bm):
        return {}
    return weight_descriptors(blocks, scales, rows, tiles.bk)


def pointer_down(act: Tensor, w: MoEWeights) -> bool:
    """Whether down_v3 loads w's "v3" words by cp.async for act at tiles of BM <= 128 (TMA_W "0", or
    no TMA on act's device): where racy_pointer_down's tiles race (choose_tiles_v3's cp_async)."""
    return w.layout == "v3" and not _wtma_on(act, True, 128)


def tma_plan(x: Tensor, lora: object | None = None) -> tuple[bool, bool]:
    """This call's (act expert by expert with down reading it by TMA, gate_up reading x by TMA from
    a copy of its rows expert by expert): TMA_DOWN / TMA_X where TMA runs (Hopper and later, the
    interpreter) and no LoRA is applied (its shrink reads act in assignment order)."""
    if not (TMA_DOWN or TMA_X) or lora is not None or not _tma_runs(x):
        return False, False
    return TMA_DOWN, TMA_X


def gather_sorted(x: Tensor, r: Routing) -> Tensor:
    """x [T, H] -> [T*k, H]: row off_e + j is x[rows[e, j] // k], the assignments expert by expert."""
    (t, h), k = x.shape, r.ids.shape[1]
    e = r.counts.shape[0]
    out = common._empty((t * k, h), x.dtype, x.device)
    bt = 32
    _gather_sorted_kernel[(e, triton.cdiv(t, bt))](
        x,
        out,
        r.counts,
        r.rows,
        t,
        x.stride(0),
        H=h,
        TOP_K=k,
        E=e,
        BE=triton.next_power_of_2(e),
        BT=bt,
        BH=256,
    )
    return out


def _check(x: Tensor, w: MoEWeights) -> None:
    if x.dtype not in (torch.bfloat16, torch.float32):  # float32: exact greedy tests, not speed
        raise ValueError(f"the v3 MoE kernels take bfloat16 or float32 activations, got {x.dtype}")
    if w.layout not in ("v3", "v3ds"):
        raise ValueError(
            f"the v3 MoE kernels need weights prepared with kernels='v3' or 'v3ds', got {w.layout!r}"
        )


def _scaled(x: Tensor, swz: bool) -> bool:
    """SWZ: the PTX dequant (CUDA); else tl.dot_scaled, whose x operand is "bf16" here."""
    return common.compiled(x) and (swz or x.dtype == torch.bfloat16)  # the interpreter runs neither


def _weight_args(blocks: Tensor, scales: Tensor, swz: bool) -> tuple[Tensor, Tensor, list[int], list[int]]:
    """Weights [..., N, K/2] and scales [..., N, G] uint8 -> the kernel's tensors and their strides
    (leading dims, then N). SWZ: int32 words, strides in words, N's stride per 16-row block."""
    if not swz:
        return blocks, scales, list(blocks.stride()[:-1]), list(scales.stride()[:-1])
    words = blocks.view(torch.int32)  # [..., N, K/8]
    s_words = scales.reshape(-1).view(torch.int32)  # flat: a row's G bytes need not fill words
    w_strides = [*words.stride()[:-2], 16 * words.stride(-2)]
    s_strides = [st // 4 for st in scales.stride()[:-2]] + [16 * scales.stride(-2) // 4]
    return words, s_words, w_strides, s_strides


def gate_up_v3(
    x: Tensor,
    r: Routing,
    w: MoEWeights,
    alpha: float,
    limit: float,
    tiles: Tiles,
    lora: tuple[Tensor, Tensor] | None = None,
    sorted_rows: bool = False,
    tma_x: bool = False,
    logits: Tensor | None = None,
    prefetch_down: bool = False,
) -> Tensor:
    """gate_up on v3 weights (layout "v3" or "v3ds"): act [T*k, I] in x.dtype. lora: (B planes
    [E, 2, I, W] contiguous, the shrunk rows [T*k, W]). sorted_rows: act's rows expert by expert
    (for down_v3(..., sorted_rows=True)), else in assignment order. tma_x: x's rows copied expert
    by expert first (gather_sorted) and read by TMA. logits [T, E] (T <= tiles.bm: one tile an
    expert): the kernel routes them itself and fills r's buffers (empty on entry) for down and
    the combine, instead of a routing launch before it. prefetch_down: each program first warms L2
    with its tile's weights and a share of its expert's down weights (_prefetch_args)."""
    if (sorted_rows or tma_x) and lora is not None:
        raise ValueError("gate_up_v3: sorted rows take no LoRA (its shrink reads act in assignment order)")
    (t, h), k = x.shape, r.ids.shape[1]
    if logits is not None and (sorted_rows or tma_x or lora is not None or t > tiles.bm):
        raise ValueError(
            f"gate_up_v3: routing in the kernel needs one tile an expert (T {t} <= BM {tiles.bm}), "
            "rows in assignment order and no LoRA"
        )
    e, _, i = w.shape
    _check(x, w)
    if lora is not None and not lora[0].is_contiguous():
        raise ValueError("gate_up_v3: the LoRA B planes must be contiguous (plane p's row c is row p*I + c)")
    swz = w.layout == "v3"
    w13, s13, w_strides, s_strides = _weight_args(w.w13, w.s13, swz)
    act = common._empty((t * k, i), x.dtype, x.device)
    largs, lkw = _lora_args(lora, x, planes=True)
    _gate_up_v3_kernel[_grid(t, k, e, i, tiles)](
        x,
        w13,
        s13,
        w.b13,
        act,
        r.counts,
        r.rows,
        *largs,
        t,
        x.stride(0),
        *w_strides,
        *s_strides,
        alpha,
        limit,
        N=i,
        K=h,
        TOP_K=k,
        E=e,
        BE=triton.next_power_of_2(e),
        BM=tiles.bm,
        BN=tiles.bn,
        BK=tiles.bk,
        HALF=tiles.half,
        SCALED=_scaled(x, swz),
        SWZ=swz,
        PREC=_precision(x),
        **lkw,
        SORTED=sorted_rows,
        **_descriptors(gather_sorted(x, r) if tma_x else None, tiles, "x_desc", "XTMA"),
        **_route_args(logits, r, t, k),
        **_wtma_args(x, w.w13, w.s13, swz, 2 * tiles.bn, tiles),
        **(_prefetch_args(x, w, tiles) if prefetch_down and swz else {}),
        **pdl.args(x, ROUTE_PDL and logits is not None),
        **common.unmasked_args(),
        num_warps=tiles.warps,
        num_stages=tiles.stages,
        maxnreg=tiles.maxnreg,
    )
    return act


def _prefetch_args(x: Tensor, w: MoEWeights, tiles: Tiles) -> dict:
    """gate_up's PF arguments where bulk prefetches run (l2_prefetch.supported) and every range is
    16-byte aligned with a multiple of 16 bytes (the instruction's rule; real shapes all are); else
    none. The W2 arguments are the uint8 tensors, so the kernel's offsets are bytes."""
    ts = (w.w13, w.s13, w.w2, w.s2)  # uint8: strides are bytes
    offsets = [t.data_ptr() for t in ts] + [t.stride(0) for t in ts] + [16 * t.stride(1) for t in ts[:2]]
    if not (
        l2_prefetch.supported(x) and all(t.is_contiguous() for t in ts) and all(b % 16 == 0 for b in offsets)
    ):
        return {}
    return dict(
        w2_ptr=w.w2,
        s2_ptr=w.s2,
        w2_bytes=w.w2.stride(0),
        s2_bytes=w.s2.stride(0),
        PF=True,
        PF_NT=32 * tiles.warps,
    )


def _route_args(logits: Tensor | None, r: Routing, t: int, k: int) -> dict:
    """The gate_up kernel's in-kernel routing arguments (ROUTE), none without logits."""
    if logits is None:
        return {}
    if logits.shape != (t, r.counts.shape[0]) or logits.stride(-1) != 1:
        raise ValueError(f"gate_up_v3: logits {tuple(logits.shape)} must be [T, E] rows, contiguous")
    return {
        "logits_ptr": logits,
        "ids_ptr": r.ids,
        "wts_ptr": r.weights,
        "stride_l": logits.stride(0),
        "ROUTE": True,
        "KP": triton.next_power_of_2(k),
        "BT": triton.next_power_of_2(t),
    }


def down_v3(
    act: Tensor,
    r: Routing,
    w: MoEWeights,
    tiles: Tiles,
    lora: tuple[Tensor, Tensor] | None = None,
    sorted_rows: bool = False,
) -> Tensor:
    """down on v3 weights (layout "v3" or "v3ds"): y [T*k, H] in act.dtype, rows in assignment order.
    sorted_rows: act's rows are expert by expert (gate_up_v3's sorted_rows), read by TMA."""
    if sorted_rows and lora is not None:
        raise ValueError("down_v3: sorted rows take no LoRA")
    a, i = act.shape
    e, h, _ = w.shape
    t = r.ids.shape[0]
    _check(act, w)
    swz = w.layout == "v3"
    w2, s2, w_strides, s_strides = _weight_args(w.w2, w.s2, swz)
    wtma = _wtma_args(act, w.w2, w.s2, swz, tiles.bn, tiles)
    if swz and not wtma and racy_pointer_down(tiles) and common.compiled(act):
        raise RacyTilesError(
            f"down_v3: {tiles} on the cp.async path gives other values from run to run on the GPU (half "
            "tiles of BM 64-128 at BK 64; bench/kernels/moe_repeat_gpu.py, bench/results v30): take BK 128, "
            "or load their weights by TMA (GPTOSS_MOE_V3_WTMA=auto or 1)"
        )
    y = common._empty((a, h), act.dtype, act.device)
    largs, lkw = _lora_args(lora, act, planes=False)
    _down_v3_kernel[_grid(t, r.ids.shape[1], e, h, tiles)](
        act,
        w2,
        s2,
        w.b2,
        y,
        r.counts,
        r.rows,
        *largs,
        t,
        *w_strides,
        *s_strides,
        N=h,
        K=i,
        E=e,
        BE=triton.next_power_of_2(e),
        BM=tiles.bm,
        BN=tiles.bn,
        BK=tiles.bk,
        HALF=tiles.half,
        SCALED=_scaled(act, swz),
        SWZ=swz,
        PREC=_precision(act),
        **lkw,
        **_descriptors(act if sorted_rows else None, tiles, "desc", "TMA"),
        **wtma,
        **common.unmasked_args(),
        num_warps=tiles.warps,
        num_stages=tiles.stages,
        maxnreg=tiles.maxnreg,
    )
    return y


class RacyTilesError(ValueError):
    """down_v3 refuses tiles whose cp.async path races (racy_pointer_down): a sweep skips them by type."""


def racy_pointer_down(tiles: Tiles) -> bool:
    """Whether down_v3's cp.async path races on these tiles: compiled on an H200 (v30), half tiles of
    BM 64 and 128 at BK 64 gave 6-20 distinct outputs in 20 runs of one input (values in 8-column
    groups of some rows), at 8 and 4 warps, 3 and 4 stages; BM 32 and 256 half tiles, BM 64 whole
    ones and BK 128 gave one, and so did every tile with its weights by TMA. Not found yet. One default
    tile is one of these, bucket 64's down since v44, which loads its weights by TMA; on the cp.async
    path (pointer_down) choose_tiles_v3 gives that bucket BK-128 tiles instead."""
    return tiles.half and tiles.bk == 64 and 64 <= tiles.bm <= 128


def _descriptors(a: Tensor | None, tiles: Tiles, name: str, flag: str) -> dict:
    """A kernel's TMA arguments: tensor descriptors of a (rows expert by expert) for the BM and BM/2
    bodies (blocks [rows, BK]) as name and name_half, and the flag; no a: the flag off."""
    if a is None:
        return {flag: False}
    full = TensorDescriptor.from_tensor(a, [tiles.bm, tiles.bk])
    half = TensorDescriptor.from_tensor(a, [tiles.bm // 2, tiles.bk]) if tiles.half else full
    return {name: full, f"{name}_half": half, flag: True}

"""What both MoE GEMM families share: the call-time switches, buffers, argument helpers and the
Triton helpers that find a program's expert tile and add a LoRA delta."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor


def env_switch(name: str, default: str) -> bool:
    """An on/off kernel switch from the environment: os.environ[name] (default when unset), "0" or "1"."""
    v = os.environ.get(name, default)
    if v not in ("0", "1"):
        raise ValueError(f"{name}={v!r}: 0 or 1")
    return v == "1"


USE_ASM = True  # the PTX dequant on CUDA (both paths); False falls back to the portable one everywhere
# GPTOSS_MOE_UNMASKED_ROWS=1: the v3 GEMMs load x / act rows without a row mask (moe_v3's gate_up and
# down, moe_v3_dec's split-K down). A tile's slots past its expert's rows name assignment 0, a real row
# never stored (_tile_rows), so the bits are the same: sm_90a, gate_up's BM-256 half body 172 -> 163
# instructions a K step, the split-K down's BM-8 tile 728 -> 705 (bench/results v74). Off until a GPU
# has timed it and run its compiled test (bench/kernels/moe_variants.py "engine-unmasked").
UNMASKED_ROWS = env_switch("GPTOSS_MOE_UNMASKED_ROWS", "0")


def unmasked_args() -> dict:
    """The GEMM kernels' UNMASKED argument: none at the default, so a launch's key (and the precompile
    manifest's) is the one without the switch."""
    return {"UNMASKED": True} if UNMASKED_ROWS else {}


def compiled(x: Tensor) -> bool:
    """Whether x's kernels run compiled on a GPU, not in the interpreter (which runs no PTX)."""
    return x.is_cuda and not triton.knobs.runtime.interpret


def _use_asm(x: Tensor) -> bool:
    return USE_ASM and compiled(x)


def _precision(x: Tensor) -> str:
    return "ieee" if x.dtype == torch.float32 else "tf32"  # float32 inputs: no TF32 rounding


def _empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    return torch.empty(shape, dtype=dtype, device=device)  # tests swap this for NaN-filled buffers


def _lora_args(lora: tuple[Tensor, Tensor] | None, x: Tensor, planes: bool) -> tuple[list, dict]:
    """The kernels' LoRA arguments: (B planes [E, 2, N, W] or B [E, N, W], s [A, W]); x stands in for
    the pointers when there is no LoRA (LORA=False compiles them out)."""
    if lora is None:
        return [x, x, 0] + ([0] if planes else []), {"LORA": False, "LW": 16}
    b, sh = lora
    return [b, sh, b.stride(0)] + ([b.stride(1)] if planes else []), {"LORA": True, "LW": b.shape[-1]}


@triton.jit
def _expert_tile_at(counts_ptr, pid_m, E: tl.constexpr, BE: tl.constexpr, BM: tl.constexpr):
    """Tile pid_m -> (expert, the tile's first slot in the expert's rows, the expert's rows, tiles in all)."""
    ex = tl.arange(0, BE)
    cnt = tl.load(counts_ptr + ex, mask=ex < E, other=0)  # [BE]
    tiles = (cnt + BM - 1) // BM
    ends = tl.cumsum(tiles, 0)  # [BE] inclusive
    e = tl.sum((ends <= pid_m).to(tl.int32), 0)  # E when pid_m is past the last tile
    first = tl.sum(tl.where(ex == e, ends - tiles, 0), 0)
    n_rows = tl.sum(tl.where(ex == e, cnt, 0), 0)
    return e, (pid_m - first) * BM, n_rows, tl.sum(tiles, 0)


@triton.jit
def _tile_rows(rows_ptr, T, e, slot0, n_rows, BM: tl.constexpr):
    """An expert's slots slot0 .. slot0 + BM - 1 -> (their assignment rows [BM], valid [BM]). Slots
    past its rows name assignment 0, a real row, never stored: UNMASKED_ROWS loads it unmasked."""
    slot = slot0 + tl.arange(0, BM)
    valid = slot < n_rows
    rows = tl.load(rows_ptr + e * T + slot, mask=valid, other=0)
    return rows, valid


@triton.jit
def _slot_expert(cnt, ex, s):
    """cnt [BE] rows per expert -> (the s-th expert with rows, its row count, the rows of the experts
    before it: where its act rows start); s past them: (0, 0, 0)."""
    hit = (cnt > 0).to(tl.int32)
    sel = (hit > 0) & ((tl.cumsum(hit, 0) - hit) == s)
    e = tl.sum(tl.where(sel, ex, 0), 0)
    return e, tl.sum(tl.where(sel, cnt, 0), 0), tl.sum(tl.where(ex < e, cnt, 0), 0)


@triton.jit
def _expert_offset(counts_ptr, e, E: tl.constexpr, BE: tl.constexpr):
    """Expert e's first row when the assignments are laid out expert by expert (counts' prefix sum)."""
    ex = tl.arange(0, BE)
    cnt = tl.load(counts_ptr + ex, mask=ex < E, other=0)
    return tl.sum(tl.where(ex < e, cnt, 0), 0)


@triton.jit
def _expert_tile(counts_ptr, rows_ptr, T, pid_m, E: tl.constexpr, BE: tl.constexpr, BM: tl.constexpr):
    """Tile pid_m -> (expert, its assignment rows [BM], valid [BM], tiles in all)."""
    e, slot0, n_rows, n_tiles = _expert_tile_at(counts_ptr, pid_m, E, BE, BM)
    rows, valid = _tile_rows(rows_ptr, T, e, slot0, n_rows, BM)
    return e, rows, valid, n_tiles


@triton.jit
def _lora_expand(acc, b_ptr, s_ptr, rows, valid, n_ld, LW: tl.constexpr, PREC: tl.constexpr):
    """acc [BN, BM] + B[n_ld] [BN, LW] @ s[rows]^T [LW, BM]: a LoRA delta added before the epilogue.

    b_ptr: one expert's B [N, LW] (plane), s_ptr: the shrunk rows [A, LW], both in the input dtype."""
    w = tl.arange(0, LW)
    b = tl.load(b_ptr + n_ld[:, None] * LW + w[None, :])  # [BN, LW]
    st = tl.load(s_ptr + rows.to(tl.int64)[None, :] * LW + w[:, None], mask=valid[None, :], other=0.0)
    return tl.dot(b, st, acc, input_precision=PREC)

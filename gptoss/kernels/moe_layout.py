"""MXFP4 expert weights as the MoE kernels read them: MoEWeights and prepare_moe_weights (once at load),
the v2 "bits" layout (_to_bits_layout) whose words two instructions turn into MMA registers, and the
v3 layout (_to_v3_layout, _to_v3_scales): those words stored as the wgmma operand's lane fragments;
optionally a second copy for large batches (MoEWeights.large, for_rows)."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor

_LAYOUTS = {"v1": "nibble", "v2": "bits", "v3": "v3", "v3ds": "v3ds"}  # kernels -> MoEWeights.layout
# Rows an expert gets (cdiv(T*k, E)) from which a forward runs MoEWeights.large when there is one.
# Until 2026-11-27: 65 (v3 from bucket 128; H100, 20b, bench/results v8: M 256 v2 431 us, v3 662).
# Since the v3 kernels' 16-byte loads and their few-rows tiles (moe_tiles), v3 is the faster at every
# M past the decode path's (H100, 20b, bench/results v21: M 32 260 -> 214 us, M 64 277 -> 218, M 128
# 367 -> 251, M 256 433 -> 299, M 512 669 -> 527), so 1: the v2 copy serves the decode kernels only
# (M <= moe_decode.MAX_T) and batches the decode path does not take (LoRA past it, the batch-invariant
# mode). GPTOSS_MOE_LARGE_MIN_ROWS sets it for A/B runs.


def _env_kernels(v: str | None) -> str:
    if v in (None, ""):
        return "auto"
    if v not in ("v2", "v3"):
        raise ValueError(
            f"GPTOSS_MOE_KERNELS={v!r}: unset (the default: v2 weights with the decode kernels and a v3 "
            "copy for large batches where it fits, else one v3 copy), v2 (v2 weights, the decode kernels, "
            "a v3 copy where it fits) or v3 (one v3 copy that every batch runs, no decode kernels)"
        )
    return v


def _env_rows(v: str | None, default: int) -> int:
    if v in (None, ""):
        return default
    if not v.isdigit() or int(v) < 1:
        raise ValueError(f"GPTOSS_MOE_LARGE_MIN_ROWS={v!r}: a whole number of rows an expert, >= 1")
    return int(v)


# GPTOSS_MOE_KERNELS: "auto" (unset), "v2" or "v3" (layouts). KERNELS: the kernels (hence weight
# layout) prepare_moe_weights picks by default, "v1" | "v2" | "v3"; v3 puts every batch on the v3
# GEMMs. Where the v3 copy does not fit beside v2's (gpt-oss-120b), auto keeps one v3 copy: on an
# H100, 600 x (1024 -> 1278) Offline 3,127 -> 4,105 tok/s, batch 1 289 -> 251 (bench/results v22).
MODE = _env_kernels(os.environ.get("GPTOSS_MOE_KERNELS"))
KERNELS = "v3" if MODE == "v3" else "v2"
LARGE_MIN_ROWS = _env_rows(os.environ.get("GPTOSS_MOE_LARGE_MIN_ROWS"), 1)


@dataclass(frozen=True, slots=True)
class MoEWeights:
    # w13 [E, 2, I, H/2] uint8: [:, 0] gate rows, [:, 1] up rows; 8 e2m1 per 4 bytes (see layout).
    # "v3" / "v3ds": [E, 2I, Kp/2], gate and up rows interleaved by 8 (_interleave8): row 16b + 8h + g
    # is plane h's row 8b + g, so one wgmma fragment holds a gate row and its up row (moe_v3).
    w13: Tensor
    s13: Tensor  # as w13: [E, 2, I, >= H/32] (or [E, 2I, ...]) e8m0 scales (rows padded to 16 bytes)
    b13: Tensor  # [E, 2, I] float32
    w2: Tensor  # [E, H, I/2] uint8
    s2: Tensor  # [E, H, >= I/32] uint8
    b2: Tensor  # [E, H] float32
    layout: str = (
        "bits"  # "bits": w13/w2 bits rearranged for the v2 kernels; "nibble": checkpoint order (v1);
    )
    # "v3": MMA lane fragments (_to_v3_layout), K padded to 64; "v3ds": checkpoint order, for tl.dot_scaled
    # The same experts in another layout, for >= LARGE_MIN_ROWS rows an expert (for_rows).
    large: MoEWeights | None = None

    @property
    def shape(self) -> tuple[int, int, int]:
        """(E, H, I)."""
        e, _, i = self.b13.shape
        return e, self.w2.shape[1], i


def large_copy(expert_bytes: int, device_bytes: int) -> str | None:
    """The layout of a second copy of the experts for large batches, or None: "v3" when the primary is
    v2 and all layers' experts take < 1/4 of the device (20b's ~12 GB on an 80 GB H100: yes; 120b's
    ~61 GB on a 141 GB H200: no, the KV cache needs that memory more)."""
    return "v3" if KERNELS == "v2" and expert_bytes < device_bytes / 4 else None


def layouts(expert_bytes: int, device_bytes: int) -> tuple[str, str | None]:
    """(the experts' layout, the layout of a second copy for large batches or None) on this device:
    KERNELS and large_copy, except that by default v2 with no room for the copy becomes one v3 copy
    (v3 is the faster past the decode kernels' batches, bench/results v21; those win batch 1 by
    ~15 %, v22, so GPTOSS_MOE_KERNELS=v2 keeps them for latency runs)."""
    large = large_copy(expert_bytes, device_bytes)
    if large is None and MODE == "auto" and KERNELS == "v2":
        return "v3", None
    return KERNELS, large


def vllm_layouts(expert_bytes: int, device_bytes: int) -> tuple[str, str | None]:
    """layouts() for our MoE inside vLLM (gptoss.vllm_moe): one v3 copy by default. vLLM sizes its KV
    cache from the memory the weights leave, so the engine's second copy (v2 + v3 for 20b on an
    H100) would cost it that much KV; one v3 copy is the memory of vLLM's own MoE (H100, random 20b,
    bench/results v24: 1.13x vLLM's own Offline 1000 x (1024 -> 1024), 1.15x its batch 1).
    GPTOSS_MOE_KERNELS=v2|v3 chooses as in the engine."""
    return ("v3", None) if MODE == "auto" else layouts(expert_bytes, device_bytes)


def for_rows(w: MoEWeights, t: int, top_k: int) -> MoEWeights:
    """The copy a forward over t tokens runs: w.large from LARGE_MIN_ROWS rows an expert on, else w."""
    if w.large is not None and -(-t * top_k // w.w13.shape[0]) >= LARGE_MIN_ROWS:
        return w.large
    return w


def prepare_moe_weights(
    gate_up_blocks: Tensor,
    gate_up_scales: Tensor,
    gate_up_bias: Tensor,
    down_blocks: Tensor,
    down_scales: Tensor,
    down_bias: Tensor,
    kernels: str | None = None,
    large: str | None = None,
) -> MoEWeights:
    """Checkpoint tensors (gate/up rows interleaved) -> MoEWeights; runs once at load.

    The even (gate) and odd (up) rows of gate_up go to separate planes, so a program owning act
    columns [n, n+BN) reads both halves of its pairs with two plain tile loads, for any BN.
    kernels ("v1" | "v2" | "v3" | "v3ds", default the module's KERNELS) fixes the weight layout, hence
    the kernels moe_forward runs on these weights: v2 rearranges the bits of every 4-byte word
    (_to_bits_layout); v3 moves bytes into MMA lane fragments, then does v2's bit rearrangement
    (_to_v3_layout); v1 and v3ds keep the checkpoint's nibble order (v3ds: tl.dot_scaled's e2m1).
    large (e.g. "v3") adds a second copy of the experts in that layout as .large, sharing the
    biases, which forwards with >= LARGE_MIN_ROWS rows an expert run (for_rows); it is built after
    the first, whose temporaries are freed by then, so the peak is the two copies and one layer's
    temporaries (plus the checkpoint tensors the caller holds).
    """
    kernels = KERNELS if kernels is None else kernels
    if large is not None:
        if large not in _LAYOUTS or large == kernels:
            raise ValueError(
                f"prepare_moe_weights: large must be another layout than {kernels!r}, got {large!r}"
            )
        args = (gate_up_blocks, gate_up_scales, gate_up_bias, down_blocks, down_scales, down_bias)
        small = prepare_moe_weights(*args, kernels=kernels)
        big = prepare_moe_weights(*args, kernels=large)
        return replace(small, large=replace(big, b13=small.b13, b2=small.b2))
    if kernels not in _LAYOUTS:
        raise ValueError(
            f"prepare_moe_weights: kernels must be 'v1' or 'v2' or 'v3' or 'v3ds', got {kernels!r}"
        )
    e, n2, g, b = gate_up_blocks.shape
    h, i = g * 32, n2 // 2
    want = {
        "gate_up_blocks": (gate_up_blocks, (e, 2 * i, h // 32, 16), torch.uint8),
        "gate_up_scales": (gate_up_scales, (e, 2 * i, h // 32), torch.uint8),
        "gate_up_bias": (gate_up_bias, (e, 2 * i), None),
        "down_blocks": (down_blocks, (e, h, i // 32, 16), torch.uint8),
        "down_scales": (down_scales, (e, h, i // 32), torch.uint8),
        "down_bias": (down_bias, (e, h), None),
    }
    for name, (t, shape, dtype) in want.items():
        if tuple(t.shape) != shape or (dtype is not None and t.dtype != dtype):
            raise ValueError(
                f"prepare_moe_weights: {name} is {tuple(t.shape)} {t.dtype}, expected "
                f"{shape}{f' {dtype}' if dtype else ''} (E={e}, H={h}, I={i})"
            )
    if n2 % 2 or i % 32:
        raise ValueError(f"prepare_moe_weights: intermediate size {i} must be a multiple of 32")

    def planes(t: Tensor) -> Tensor:  # [E, 2I, ...] interleaved -> [E, 2, I, ...]
        return t.reshape(t.shape[0], i, 2, -1).transpose(1, 2).contiguous()

    def padded(s: Tensor) -> Tensor:  # the kernels never read the pad
        return F.pad(s, (0, -s.shape[-1] % 16)).contiguous()

    def interleaved(t: Tensor) -> Tensor:  # [E, 2I, ...] checkpoint rows -> [E, 2I, X], _interleave8
        out = t.new_empty(e, 2 * i, t[0, 0].numel())
        for x in range(e):  # one expert at a time: no temporary the size of a layer's experts
            out[x] = _interleave8(planes(t[x : x + 1])).reshape(2 * i, -1)
        return out

    w2 = down_blocks.reshape(e, h, i // 2)  # a view of the checkpoint's tensor: never written
    if kernels in ("v2", "v3"):
        top = max(int(gate_up_scales.max()), int(down_scales.max()))  # once at load
        if top > MAX_SCALE_V2:
            raise ValueError(
                f"prepare_moe_weights: scale byte {top} > {MAX_SCALE_V2} (weights above 12): "
                f"the {kernels} kernels' bf16 scale factor 2^(s-1) would overflow; use kernels='v1'"
            )
    # Each layer's peak is its checkpoint experts plus one copy (the KV cache is sized before this
    # runs, with a step's workspace to spare: 120b's 1 GB of gate_up a layer, three copies at once,
    # ran out of memory on an 80 GB H100): the private copies are converted in place.
    if kernels in ("v3", "v3ds"):
        w13, s13_il = interleaved(gate_up_blocks), interleaved(gate_up_scales)
        v3 = kernels == "v3"
        return MoEWeights(
            w13=_to_v3_layout(w13, out=w13 if h % 64 == 0 else None) if v3 else w13,
            s13=_to_v3_scales(s13_il) if v3 else padded(s13_il),
            b13=planes(gate_up_bias.float()).view(e, 2, i),
            w2=_to_v3_layout(w2) if v3 else w2.contiguous(),
            s2=_to_v3_scales(down_scales.contiguous()) if v3 else padded(down_scales),
            b2=down_bias.float().contiguous(),
            layout=kernels,
        )
    w13 = planes(gate_up_blocks).view(e, 2, i, h // 2)
    if kernels == "v2":
        w13, w2 = _to_bits_layout(w13, out=w13), _to_bits_layout(w2)
    return MoEWeights(
        w13=w13,
        s13=padded(planes(gate_up_scales)),
        b13=planes(gate_up_bias.float()).view(e, 2, i),
        w2=w2.contiguous(),
        s2=padded(down_scales),
        b2=down_bias.float().contiguous(),
        layout=_LAYOUTS[kernels],
    )


def _interleave8(p: Tensor) -> Tensor:
    """[E, 2, I, ...] gate / up planes -> [E, I/8, 2, 8, ...]: rows 16b + 8h + g of the flattened [E, 2I]
    are plane h's row 8b + g. In a 16-row MMA fragment lane g holds rows g and g + 8, so a program
    that owns 16b .. 16b + 15 has gate row 8b + g and its up row in one thread (moe_v3's SwiGLU)."""
    e, _, i, *rest = p.shape
    return p.reshape(e, 2, i // 8, 8, *rest).transpose(1, 2).contiguous()


# The v2 layout. The kernels turn each 4-byte word (8 values of one row, in K order) into the 4
# bf16x2 registers the MMA takes, values (2j, 2j+1) in register j, each value as e2m1 * 2^-126:
# sign at bit 15, the magnitude bits e1 e0 m at bits 8:6 (bf16's low exponent bits and top mantissa
# bit; the code 0.5 lands on the subnormal 2^-127), +16 for the odd value; one bf16x2 multiply by
# 2^(s - 1) then makes them exact. No 4 rotations of one word can place all 32 bits (checked by
# exhaustive search), so registers 0-2 take a rotation and a mask (2 SASS ops) and register 3 the
# bits already in place plus two shifted by 8 (3 ops): 9 ops for 8 values (v1: 18 + 4 regroupings).
_E2M1_TO_BF16_BIT = (6, 7, 8, 15)  # e2m1 bit i (m, e0, e1, sign) -> bf16 bit; the odd value +16
_ROTATE = (4, 10, 14)  # register j < 3 = rotl(word, _ROTATE[j]) & 0x81C081C0
_BIT_FROM = tuple({t: (t - r) % 32 for t in range(32)} for r in _ROTATE) + (
    {t: t - 8 if t in (8, 24) else t for t in range(32)},
)  # register 3: (w & 0x80C080C0) | ((w << 8) & 0x01000100)
MAX_SCALE_V2 = 128  # v2 multiplies by the bf16 2^(s - 1); 2^127 is bf16's largest power of 2


def _to_bits_layout(blocks: Tensor, out: Tensor | None = None) -> Tensor:
    """[E, ..., K/2] uint8 in checkpoint order (byte b: value 2b low nibble, 2b+1 high) -> the v2 layout.

    One expert at a time, so the temporaries stay at an expert's size (120b: 1/128 of a layer);
    out=blocks works in place (each expert is read whole before it is written)."""
    out = torch.empty_like(blocks) if out is None else out
    for e in range(blocks.shape[0]):
        words = blocks[e].contiguous().view(torch.int32)  # [..., K/8]; little endian: byte j = bits 8j..8j+7
        acc = torch.zeros_like(words)
        for j, bit_from in enumerate(_BIT_FROM):  # register j <- byte j
            for half in (0, 1):  # the low nibble (value 2j) -> bits 15:0, the high one -> 31:16
                for i, t in enumerate(_E2M1_TO_BF16_BIT):
                    acc |= ((words >> (8 * j + 4 * half + i)) & 1) << bit_from[t + 16 * half]
        out[e] = acc.view(torch.uint8).view(blocks.shape[1:])
    return out


# The v3 layout: wgmma takes its register operand (here W, [BN, BK]) as mma.sync's A fragments: in
# each 16-row x 16-K block, lane (g, t) = (lane / 4, lane % 4) holds rows g and g + 8 at K 2t, 2t+1
# and 2t+8, 2t+9, in 4 bf16x2 registers (j = 2q + h: row g + 8h, K 2t + 8q). So one 4-byte word is
# a lane's k16 step: byte j = the checkpoint byte (row g + 8h, K/2 column 4q + t), whose two nibbles
# become register j; 4 such words (the 4 k16 steps of 64 K) are 16 contiguous bytes, one 128-bit
# load a lane, a warp's 512 bytes contiguous. Bits within each word then go to v2's order.
def _to_v3_layout(blocks: Tensor, out: Tensor | None = None) -> Tensor:
    """[E, ..., N, K/2] uint8 in checkpoint order (N % 16 == 0) -> [E, ..., N, Kp/2], Kp = K padded
    to 64 with zeros: each 16-row block is [K/64 chunks kc, 8 g, 4 t, 4 s (k16 step), 2 q, 2 h]
    bytes = checkpoint byte (row 16 rb + 8h + g, column 32 kc + 8s + 4q + t), in v2's bits order.
    out=blocks works in place when K % 64 == 0 (each expert is copied before it is written)."""
    *lead, n, kb = blocks.shape
    kc = -(-kb // 32)
    if out is None:
        out = torch.empty(*lead, n, 32 * kc, dtype=torch.uint8, device=blocks.device)
    elif out.shape != (*lead, n, 32 * kc):
        raise ValueError(f"_to_v3_layout: out is {tuple(out.shape)}, expected {(*lead, n, 32 * kc)}")
    for e in range(lead[0]):  # one expert at a time, as _to_bits_layout
        b = F.pad(blocks[e], (0, 32 * kc - kb))  # [..., N, 32 KC]; a copy even when nothing is padded
        d = b.dim() - 2  # leading dims before N
        b = b.reshape(*b.shape[:d], n // 16, 2, 8, kc, 4, 2, 4)  # rb, h, g, kc, s, q, t
        b = b.permute(*range(d), d, d + 3, d + 2, d + 6, d + 4, d + 5, d + 1)  # rb, kc, g, t, s, q, h
        out[e] = b.reshape(*b.shape[:d], n, 32 * kc)
    return _to_bits_layout(out, out=out)  # in place: no third copy of the experts while prepare runs


def _to_v3_scales(scales: Tensor) -> Tensor:
    """[E, ..., N, K/32] e8m0 bytes -> [E, ..., N, Kp/32]: each 16-row block is [K/64 chunks kc, 8 g,
    2 s2, 2 h] = the scale of row 16 rb + 8h + g, K group 2 kc + s2: one int32 word a lane's 16 bytes."""
    *lead, n, g = scales.shape
    kc = -(-g // 2)
    s = F.pad(scales, (0, 2 * kc - g))  # zero bytes: 2^-127 times zero weights
    d = len(lead)
    s = s.reshape(*lead, n // 16, 2, 8, kc, 2)  # rb, h, g, kc, s2
    s = s.permute(*range(d), d, d + 3, d + 2, d + 4, d + 1)  # rb, kc, g, s2, h
    return s.reshape(*lead, n, 2 * kc).contiguous()

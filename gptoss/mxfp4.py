"""MXFP4 (OCP microscaling FP4): 32 e2m1 values share one e8m0 scale; pack, unpack, dequantize."""

from __future__ import annotations

import torch
from torch import Tensor

BLOCK = 32  # values per scale
BYTES_PER_BLOCK = BLOCK // 2  # two e2m1 nibbles per byte, low nibble first
SCALE_BIAS = 127  # e8m0: value 2^(s - 127)

# e2m1 code -> value: bit 3 is the sign, bits 0-2 index the magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6.
E2M1_VALUES: tuple[float, ...] = (
    0.0,
    0.5,
    1.0,
    1.5,
    2.0,
    3.0,
    4.0,
    6.0,
    -0.0,
    -0.5,
    -1.0,
    -1.5,
    -2.0,
    -3.0,
    -4.0,
    -6.0,
)
E2M1_MAX = 6.0


def _lut(device: torch.device) -> Tensor:
    return torch.tensor(E2M1_VALUES, dtype=torch.float32, device=device)


_BYTE_LUTS: dict[torch.device, Tensor] = {}


def _byte_lut(device: torch.device) -> Tensor:
    """[256, 2] float32: byte -> (value of its low nibble, value of its high nibble)."""
    if device not in _BYTE_LUTS:
        codes = torch.arange(256, device=device)
        lut = _lut(device)
        _BYTE_LUTS[device] = torch.stack((lut[codes & 0x0F], lut[codes >> 4]), dim=-1)
    return _BYTE_LUTS[device]


def unpack(blocks: Tensor) -> Tensor:
    """[..., G, 16] uint8 -> [..., G, 32] float32 e2m1 values (unscaled); low nibble comes first."""
    if blocks.dtype != torch.uint8:
        raise TypeError(f"mxfp4 blocks must be uint8, got {blocks.dtype}")
    pairs = _byte_lut(blocks.device)[blocks.long()]  # [..., G, 16, 2]: (lo, hi) per byte
    return pairs.flatten(-2)  # [..., G, 32]: lo0 hi0 lo1 hi1 ...


def dequantize(blocks: Tensor, scales: Tensor, dtype: torch.dtype = torch.bfloat16) -> Tensor:
    """blocks [..., K/32, 16] uint8, scales [..., K/32] uint8 -> [..., K] in `dtype`.

    Every MXFP4 value is e2m1 * 2^k, exactly representable in bf16 and fp32, so the result is
    exact in either dtype (barring scales outside bf16's exponent range, which gpt-oss never uses).
    """
    if scales.dtype != torch.uint8:
        raise TypeError(f"mxfp4 scales must be uint8, got {scales.dtype}")
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != BYTES_PER_BLOCK:
        raise ValueError(
            f"mxfp4 blocks {tuple(blocks.shape)} do not match scales {tuple(scales.shape)}: "
            f"expected blocks [..., G, {BYTES_PER_BLOCK}] and scales [..., G]"
        )
    values = unpack(blocks)  # [..., G, 32]
    exponent = scales.to(torch.int32) - SCALE_BIAS  # [..., G]
    values = torch.ldexp(values, exponent.unsqueeze(-1))
    return values.flatten(-2).to(dtype)  # [..., K]


def quantize(w: Tensor) -> tuple[Tensor, Tensor]:
    """[..., K] float -> (blocks [..., K/32, 16] uint8, scales [..., K/32] uint8), round to nearest.

    Each block's scale is the smallest power of two that brings its absmax within e2m1's range
    (6.0), so a block that already is MXFP4 (any e2m1 values times 2^k) quantizes exactly.
    """
    if w.shape[-1] % BLOCK:
        raise ValueError(f"mxfp4 quantize: last dim {w.shape[-1]} is not a multiple of {BLOCK}")
    x = w.float().unflatten(-1, (-1, BLOCK))  # [..., G, 32]
    amax = x.abs().amax(dim=-1)  # [..., G]
    # Smallest k with amax / 2^k <= 6; all-zero blocks get the smallest scale.
    k = torch.ceil(torch.log2(amax / E2M1_MAX)).nan_to_num(nan=-SCALE_BIAS, neginf=-SCALE_BIAS)
    k = k.clamp(-SCALE_BIAS, 255 - SCALE_BIAS - 1).to(torch.int32)  # 255 is e8m0's NaN
    scaled = torch.ldexp(x, -k.unsqueeze(-1))  # [..., G, 32], |.| <= 6
    mags = _lut(x.device)[:8]  # [8] non-negative e2m1 magnitudes
    # Round to the nearest magnitude; ties go to the lower code, like round-half-to-even
    # mostly would (e2m1 ties are rare and either choice is within half a step).
    code = (scaled.abs().unsqueeze(-1) - mags).abs().argmin(dim=-1)  # [..., G, 32]
    code = code | (torch.signbit(scaled).long() << 3)
    code = code.to(torch.uint8)
    packed = code[..., 0::2] | (code[..., 1::2] << 4)  # [..., G, 16]
    scales = (k + SCALE_BIAS).to(torch.uint8)
    return packed.contiguous(), scales.contiguous()

"""The KV cache's element type (`--kv-cache-dtype`): `auto` stores K and V in the model's dtype,
`fp8` in float8 e4m3fn, half the bytes a token, so twice the tokens fit and attention reads half.

An fp8 element is the nearest e4m3fn value of the model-dtype K or V, ties to even, saturated at
+-448: scale 1, as vLLM's fp8 KV cache without calibrated scales. It changes the numerics (3
mantissa bits), so it is an option, never the default. The torch reference (gptoss.paged_attention)
stores `quantize(x)`; the Triton writers give the same bytes (gptoss.kernels.fp8)."""

from __future__ import annotations

import torch
from torch import Tensor

from gptoss.engine_config import KV_CACHE_DTYPES

E4M3_MAX = 448.0


def kv_torch_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """The cache tensors' dtype for --kv-cache-dtype `name` (EngineConfig checked it)."""
    if name not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype {name!r}: choose one of {', '.join(KV_CACHE_DTYPES)}")
    return torch.float8_e4m3fn if name == "fp8" else model_dtype


def is_fp8(t: Tensor) -> bool:
    return t.dtype == torch.float8_e4m3fn


def quantize(x: Tensor) -> Tensor:
    """x (any float dtype) -> float8_e4m3fn, ties to even, saturating at +-448."""
    return x.float().clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)

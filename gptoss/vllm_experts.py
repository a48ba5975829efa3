"""gpt-oss's MXFP4 experts as vLLM holds them, run by our MoE: Triton kernels on CUDA, the reference on CPU.

vLLM's gpt-oss loader fills, per layer, exactly the checkpoint's tensors with the last two dims of
the blocks merged: w13 [E, 2I, H/2] uint8 (gate/up rows interleaved), w13 scales [E, 2I, H/32],
w2 [E, H, I/2], w2 scales [E, H, I/32], biases [E, 2I] and [E, H]. No vLLM import here, so the
tests check both paths against the reference model without an engine.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from gptoss import mxfp4

PATHS = ("triton", "torch")
_TORCH_PATH: dict[str, GptossExperts] = {}  # the experts the custom op below runs, by key


def _blocks(w: Tensor) -> Tensor:
    """[E, N, K/2] uint8 -> [E, N, K/32, 16]: the checkpoint's view of the same bytes."""
    e, n, half = w.shape
    return w.view(e, n, half // mxfp4.BYTES_PER_BLOCK, mxfp4.BYTES_PER_BLOCK)


class GptossExperts:
    """experts(x [T, H], router logits [T, E]) -> [T, H] in x.dtype."""

    def __init__(
        self,
        w13: Tensor,
        s13: Tensor,
        b13: Tensor,
        w2: Tensor,
        s2: Tensor,
        b2: Tensor,
        *,
        top_k: int,
        alpha: float,
        limit: float,
        dtype: torch.dtype,
        path: str,
        kernels: str | None = None,
        large: str | None = None,
    ) -> None:
        """kernels: the experts' layout on the triton path (None: moe_layout.KERNELS); large: the
        layout of a second copy for large batches (v2 only), else None (moe_layout.layouts decides
        both for a device)."""
        if path not in PATHS:
            raise ValueError(f"path must be one of {', '.join(PATHS)}, got {path!r}")
        e, n2, half = w13.shape
        if (e, half * 2, n2 // 2 // mxfp4.BLOCK) != (w2.shape[0], w2.shape[1], s2.shape[2]):
            raise ValueError(f"MXFP4 experts: w13 {tuple(w13.shape)} and w2 {tuple(w2.shape)} do not match")
        self.path, self.top_k, self.alpha, self.limit = path, top_k, alpha, limit
        if path == "triton":
            from gptoss.kernels import moe

            # The v2 kernels scale by a bf16 2^(s - 1): a larger scale byte (no released
            # checkpoint has one) takes the v1 kernels, which read the checkpoint's order.
            top = max(int(s13.max()), int(s2.max()))
            kernels = kernels if top <= moe.MAX_SCALE_V2 else "v1"
            self.kernels = kernels or moe.KERNELS
            self.large = large if self.kernels == "v2" else None
            packed = (_blocks(w13), s13, b13, _blocks(w2), s2, b2)
            self._weights = moe.prepare_moe_weights(*packed, kernels=kernels, large=self.large)
        else:
            from gptoss.config import PRESETS
            from gptoss.model import Experts

            self.kernels, self.large = "torch", None
            # Experts reads only quant_method and the SwiGLU constants from its config.
            cfg = replace(PRESETS["tiny"], quant_method="mxfp4", swiglu_alpha=alpha, swiglu_limit=limit)
            named = {
                "gate_up_proj_blocks": _blocks(w13),
                "gate_up_proj_scales": s13,
                "gate_up_proj_bias": b13.to(dtype),
                "down_proj_blocks": _blocks(w2),
                "down_proj_scales": s2,
                "down_proj_bias": b2.to(dtype),
            }
            self._experts = Experts(cfg, named, dtype)  # keeps the packed bytes; decodes per call
            self._key = f"{id(self):x}"
            _TORCH_PATH[self._key] = self

    def __call__(self, x: Tensor, logits: Tensor) -> Tensor:
        if self.path == "triton":
            from gptoss.kernels.moe import moe_forward_from_logits

            return moe_forward_from_logits(x, logits, self.top_k, self._weights, self.alpha, self.limit)
        return torch.ops.gptoss.vllm_moe_torch(x, logits, self._key)


# vLLM on CPU calls its MoE layer inside the model torch.compile traces (on CUDA, inside an opaque
# op of its own); the reference MoE's loop over the experts a batch uses cannot be traced, so the
# torch path is an opaque op too.
@torch.library.custom_op("gptoss::vllm_moe_torch", mutates_args=())
def _torch_path(x: Tensor, logits: Tensor, key: str) -> Tensor:
    from gptoss.model import mix_experts

    experts = _TORCH_PATH[key]
    return mix_experts(x, logits, experts.top_k, experts._experts)


@_torch_path.register_fake
def _(x: Tensor, logits: Tensor, key: str) -> Tensor:
    return torch.empty_like(x)

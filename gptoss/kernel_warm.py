"""What start-up runs on a KernelModel so Triton compiles before the first request: the MoE at every
tile bucket (kernel_runner, before graph capture), and the decode launch sizes that reach each decode
attention specialization (gptoss.warmup's second phase runs them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from gptoss.kernels import batch_invariant as bi
from gptoss.kernels.attention import decode_group_sizes, decode_key_bound, decode_sms
from gptoss.kernels.moe import moe_forward

if TYPE_CHECKING:
    from gptoss.kernel_model import KernelModel


def warm_sizes(max_tokens: int) -> list[int]:
    """warm_moe's token counts: 2^k - 1 and 2^k from 32 up, the last capped at max_tokens."""
    sizes, t = [], 32
    while True:
        sizes += [n for n in (t - 1, t) if n <= max_tokens] or [max_tokens]
        if t >= max_tokens:
            return sizes
        t *= 2


@torch.inference_mode()
def warm_moe(model: KernelModel, max_tokens: int) -> None:
    """Run the MoE at each power of two from 32 tokens to max_tokens and one token short of it, so
    Triton compiles every tile bucket a step can reach, each for token counts that are and are not
    multiples of 16 (a specialization of their own), before the first request: a prefill then never
    waits seconds for the compiler (its disk cache hides this only on a machine that compiled them
    before). Decode sizes compile in graph capture."""
    lay = model.layers[0]
    g = torch.Generator(device=model.embed.device).manual_seed(0)
    forward = bi.moe_forward if model.batch_invariant else moe_forward
    for t in warm_sizes(max_tokens):
        x = torch.randn(t, model.embed.shape[1], generator=g, device=model.embed.device)
        forward(
            x.to(model.embed.dtype),
            lay.router_w,
            lay.router_b,
            model.top_k,
            lay.moe,
            model.alpha,
            model.limit,
        )


def attention_warm_sizes(model: KernelModel, max_seqs: int) -> list[int]:
    """Eager decode launches of these sizes (up to max_seqs sequences) reach every attention
    specialization a decode group of `model` can select (kernels.attention.decode_group_sizes)."""
    keys = {decode_key_bound(model.max_positions, lay.window) for lay in model.layers}
    return decode_group_sizes(max_seqs, model.hkv, tuple(sorted(keys)), decode_sms(model.embed))

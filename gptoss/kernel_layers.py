"""The model's weights laid out for the Triton kernels, built once at load time (kernel_model runs
them): q/k/v fused into one projection, the experts prepared for the MoE kernels (and a second copy
for large batches when the device has room), the LoRA adapters stacked for the kernels' shrink and
expand."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from gptoss.kernels import moe_layout
from gptoss.kernels.moe import MoEWeights, prepare_moe_weights
from gptoss.kernels.moe_lora import MoELora, prepare_moe_lora
from gptoss.model import GptOss

if TYPE_CHECKING:
    from gptoss.lora_stack import LayerLora, LoraStack

log = logging.getLogger("gptoss.kernel_layers")


@dataclass(slots=True)
class Layer:
    """One decoder layer's weights as the kernels take them."""

    ln1: Tensor  # [H] float32
    wqkv: Tensor  # [(Hq + 2 Hkv) D, H]
    bqkv: Tensor  # [(Hq + 2 Hkv) D]
    sinks: Tensor  # [Hq] float32
    wo: Tensor  # [H, Hq D]
    bo: Tensor  # [H]
    ln2: Tensor  # [H] float32
    router_w: Tensor  # [E, H]
    router_b: Tensor  # [E]
    moe: MoEWeights
    window: int | None
    pool: str  # "full" | "ring"
    index: int  # layer index inside its pool's cache
    lora_qkv: tuple[Tensor, Tensor] | None = None  # A [3W, H], B [(Hq + 2 Hkv) D, 3W] block-diagonal
    lora_o: tuple[Tensor, Tensor] | None = None  # A [W, Hq D], B [H, W]
    lora_moe: MoELora | None = None


def _experts_and_device_bytes(ref: GptOss) -> tuple[int, int]:
    """The packed experts' bytes over all layers, and the device's total memory (0 on CPU)."""
    experts = [block.mlp.experts for block in ref.layers]
    blocks = experts[0].gate_up_blocks
    if not blocks.is_cuda:
        return 0, 0
    size = sum(
        t.numel() * t.element_size()
        for ex in experts
        for t in (ex.gate_up_blocks, ex.gate_up_scales, ex.down_blocks, ex.down_scales)
    )
    return size, torch.cuda.get_device_properties(blocks.device).total_memory


def large_copy_bytes(ref: GptOss) -> int:
    """The device bytes KernelModel will add for the experts' large-batch copy (0 for none): the KV
    cache, sized before the KernelModel is built, leaves them free."""
    size, total = _experts_and_device_bytes(ref)
    return size if total and moe_layout.large_copy(size, total) else 0


def moe_layouts(ref: GptOss) -> tuple[str | None, str | None]:
    """moe_layout.layouts for this model on its device ((None, None) on CPU: the defaults); logs which."""
    size, total = _experts_and_device_bytes(ref)
    if not total:
        return None, None
    kernels, large = moe_layout.layouts(size, total)
    what = (
        f"{kernels} and a second ({large}) copy for large batches" if large else f"one copy ({kernels}) only"
    )
    log.info("MoE experts %.1f GB, device %.1f GB: %s", size / 1e9, total / 1e9, what)
    return kernels, large


def _attn_lora(ll: LayerLora, out_sizes: tuple[int, int, int]) -> tuple[Tensor, Tensor] | None:
    """q/k/v adapters as one shrink (A stacked) and one expand (B block-diagonal); absent ones are 0."""
    present = [ll.attn.get(p) for p in ("q_proj", "k_proj", "v_proj")]
    if not any(present):
        return None
    ref = next(ab for ab in present if ab is not None)
    w, h = ref[0].shape
    a = ref[0].new_zeros(3 * w, h)
    b = ref[0].new_zeros(sum(out_sizes), 3 * w)
    row = 0
    for j, (ab, n) in enumerate(zip(present, out_sizes, strict=True)):
        if ab is not None:
            a[j * w : (j + 1) * w] = ab[0]
            b[row : row + n, j * w : (j + 1) * w] = ab[1]
        row += n
    return a, b


def build_layers(ref: GptOss, lora: LoraStack | None, kernels: str | None, large: str | None) -> list[Layer]:
    """ref's layers in the kernels' layout (kernels: the experts' layout, None for moe_layout's default;
    large: their large-batch copy's layout, or None); frees ref's packed experts as it goes."""
    counts = {"full": 0, "ring": 0}
    qkv_sizes = (ref.cfg.q_size, ref.cfg.kv_size, ref.cfg.kv_size)
    layers: list[Layer] = []
    for li, block in enumerate(ref.layers):
        a, m = block.attn, block.mlp
        ll = lora.layers[li] if lora is not None else None
        pool = "full" if a.window is None else "ring"
        ex = m.experts
        layers.append(
            Layer(
                ln1=block.input_norm,
                wqkv=torch.cat([a.q_proj_weight, a.k_proj_weight, a.v_proj_weight]).contiguous(),
                bqkv=torch.cat([a.q_proj_bias, a.k_proj_bias, a.v_proj_bias]).contiguous(),
                sinks=a.sinks.float().contiguous(),
                wo=a.o_proj_weight,
                bo=a.o_proj_bias,
                ln2=block.post_attention_norm,
                router_w=m.router_weight,
                router_b=m.router_bias,
                moe=prepare_moe_weights(
                    ex.gate_up_blocks,
                    ex.gate_up_scales,
                    ex.gate_up_bias,
                    ex.down_blocks,
                    ex.down_scales,
                    ex.down_bias,
                    kernels=kernels,
                    large=large,
                ),
                window=a.window,
                pool=pool,
                index=counts[pool],
                lora_qkv=None if ll is None else _attn_lora(ll, qkv_sizes),
                lora_o=None if ll is None else ll.attn.get("o_proj"),
                lora_moe=None if ll is None else prepare_moe_lora(ll.experts, lora.rank),
            )
        )
        counts[pool] += 1
        # The reference layout of the experts is not needed any more: free it layer by layer,
        # so a repacked copy never doubles the experts' memory (120b: 60 GB).
        for name in ("gate_up_blocks", "gate_up_scales", "down_blocks", "down_scales"):
            setattr(ex, name, None)
    return layers

"""The loaded LoRA adapters stacked side by side, so one batch can mix them (and the base model).

Adapter i (1-based; 0 is no adapter) owns rank columns [(i-1)*R, i*R) of every stacked A (rows) and
B (columns), R the largest rank, zero-padded; the width W = L*R is padded to a power of two >= 16 (the
Triton kernels' dot needs it). A token's delta is then ((x @ A^T) * mask) @ B^T with mask [T, W] one
on its adapter's columns: the other adapters' products are exact zeros, so a mixed batch computes
exactly what each sequence alone would. Each target's scale (alpha / r) is folded into its B.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from gptoss.config import ModelConfig
from gptoss.lora import ATTN_TARGETS, EXPERT_TARGETS, LoraAdapter, LoraError, load_adapter


@dataclass(frozen=True, slots=True)
class LayerLora:
    """One layer's stacked adapters; a target no adapter adapts is absent."""

    attn: dict[str, tuple[Tensor, Tensor]]  # proj -> A [W, in], B [out, W]
    experts: dict[
        str, tuple[Tensor, Tensor]
    ]  # gate_up_proj: A [E, W, H], B [E, 2I, W]; down_proj: [E, W, I], [E, H, W]


@dataclass(frozen=True, slots=True)
class LoraStep:
    """One layer's adapters and the step's token mask: what the reference model applies."""

    weights: LayerLora
    mask: Tensor  # [T, W] 1 on each token's adapter columns

    def linear(self, proj: str, x: Tensor) -> Tensor | None:
        """x [T, in] -> the delta [T, out] of the attention projection, or None."""
        ab = self.weights.attn.get(proj)
        if ab is None:
            return None
        a, b = ab
        return F.linear(F.linear(x, a) * self.mask.to(x.dtype), b)

    def expert(self, target: str, e: int, x: Tensor, tok: Tensor) -> Tensor | None:
        """x [N, in], the rows of tokens tok [N] routed to expert e -> the delta [N, out], or None."""
        ab = self.weights.experts.get(target)
        if ab is None:
            return None
        a, b = ab
        return F.linear(F.linear(x, a[e].to(x.dtype)) * self.mask[tok].to(x.dtype), b[e].to(x.dtype))


class LoraStack:
    def __init__(
        self, adapters: list[LoraAdapter], mc: ModelConfig, device: torch.device, dtype: torch.dtype
    ) -> None:
        if not adapters:
            raise ValueError("LoraStack needs at least one adapter")
        names = [a.name for a in adapters]
        if dup := sorted({n for n in names if names.count(n) > 1}):
            raise LoraError(f"--lora: adapter name {dup[0]!r} is given twice; name them NAME=PATH")
        self.names: dict[str, int] = {n: i + 1 for i, n in enumerate(names)}
        self.adapters = adapters
        self.rank = r = max(a.rank for a in adapters)
        self.width = w = max(16, 1 << (len(adapters) * r - 1).bit_length())
        self.device, self.dtype = device, dtype
        e = mc.num_local_experts
        self.layers: list[LayerLora] = []
        for layer in range(mc.num_hidden_layers):
            attn, experts = {}, {}
            for target in ATTN_TARGETS + EXPERT_TARGETS:
                got = [(i, a.targets.get((layer, target))) for i, a in enumerate(adapters)]
                got = [(i, t) for i, t in got if t is not None]
                if not got:
                    continue
                t0 = got[0][1]
                lead = (e,) if target in EXPERT_TARGETS else ()
                a_st = torch.zeros(*lead, w, t0.a.shape[-1], dtype=torch.float32)
                b_st = torch.zeros(*lead, t0.b.shape[-2], w, dtype=torch.float32)
                for i, t in got:
                    cols = slice(i * r, i * r + t.rank)
                    a_st[..., cols, :] = t.a.float()
                    b_st[..., cols] = t.b.float() * t.scale
                pair = (a_st.to(device, dtype).contiguous(), b_st.to(device, dtype).contiguous())
                (experts if target in EXPERT_TARGETS else attn)[target] = pair
            self.layers.append(LayerLora(attn, experts))
        block = torch.arange(w) // r + 1  # [W] the adapter index owning each column (> L: padding)
        # [L+1, W]: row i is adapter i's mask; row 0 (no adapter) all zeros.
        self.table = (block[None, :] == torch.arange(len(adapters) + 1)[:, None]).to(device, dtype)

    @classmethod
    def load(
        cls, specs: tuple[str, ...], mc: ModelConfig, device: torch.device, dtype: torch.dtype
    ) -> LoraStack:
        """The adapters of --lora NAME=PATH ... (each checked against the model), stacked on `device`."""
        return cls([load_adapter(s, mc) for s in specs], mc, device, dtype)

    def index(self, name: str | None) -> int:
        """The adapter index of a request's adapter name (None: the base model, 0)."""
        if name is None:
            return 0
        i = self.names.get(name)
        if i is None:
            raise ValueError(f"unknown LoRA adapter {name!r}; loaded: {', '.join(self.names)}")
        return i

    def mask(self, index: Tensor) -> Tensor:
        """index [T] adapter index per token -> mask [T, W] in the compute dtype."""
        return self.table.index_select(0, index)

    def step(self, layer: int, mask: Tensor) -> LoraStep:
        return LoraStep(self.layers[layer], mask)

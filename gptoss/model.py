"""The reference gpt-oss model in plain PyTorch: the oracle that fast kernels are tested against.

T tokens of possibly many sequences come in flattened; the model knows nothing of batches, caches
or schedulers. Attention itself is delegated to an AttentionFn, which knows sequence boundaries and
owns the KV cache (gptoss.attention_ref for one sequence, gptoss.paged_attention for the engine).
MXFP4 experts stay packed in memory; each forward decodes only the experts its tokens selected.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gptoss import mxfp4
from gptoss.checkpoint import load
from gptoss.config import ModelConfig

if TYPE_CHECKING:
    from gptoss.lora_stack import LoraStack, LoraStep


def _under(w: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """The tensors named prefix + rest, keyed by rest (checkpoint names, one module deeper)."""
    return {k.removeprefix(prefix): v for k, v in w.items() if k.startswith(prefix)}


class AttentionFn(Protocol):
    def __call__(
        self,
        layer: int,
        q: Tensor,  # [T, Hq, D], rope applied
        k: Tensor,
        v: Tensor,  # [T, Hkv, D], rope applied to k
        sinks: Tensor,  # [Hq] float32
        window: int | None,  # sliding_window for sliding layers, None for full
        scale: float,
    ) -> Tensor: ...  # [T, Hq, D]


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """[T, H] -> [T, H]; computed in float32 with a float32 weight, like the release."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (weight * xf).to(x.dtype)


class Rope(nn.Module):
    """YaRN rotary embedding (non-interleaved halves), cos/sin scaled by YaRN's attention factor."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, base, y = cfg.head_dim, cfg.rope_theta, cfg.rope
        pos_freqs = base ** (torch.arange(0, d, 2, dtype=torch.float32) / d)  # [D/2]

        def correction_dim(rotations: float) -> float:
            # The dimension whose wavelength fits `rotations` times into the original context.
            return (
                d
                * math.log(y.original_max_position_embeddings / (rotations * 2 * math.pi))
                / (2 * math.log(base))
            )

        low, high = correction_dim(y.beta_fast), correction_dim(y.beta_slow)
        if y.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, d - 1)
        if low == high:
            high += 0.001  # avoid a zero-width ramp
        ramp = ((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        # Low dimensions (short wavelengths) extrapolate; high ones interpolate by `factor`.
        extrapolate = 1 - ramp  # [D/2]
        inv_freq = (1 / (y.factor * pos_freqs)) * ramp + (1 / pos_freqs) * extrapolate
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [D/2]
        self.attention_factor = y.attention_factor

    def forward(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """positions [T] -> cos, sin [T, D/2] float32."""
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        return freqs.cos() * self.attention_factor, freqs.sin() * self.attention_factor


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [T, heads, D]; cos, sin [T, D/2]. Rotates (first half, second half) pairs, in float32."""
    x1, x2 = x.float().chunk(2, dim=-1)  # [T, heads, D/2] each
    cos, sin = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, w: dict[str, Tensor]):
        super().__init__()
        self.layer, self.window = layer, cfg.window(layer)
        self.n_heads, self.n_kv, self.head_dim = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        self.scale = cfg.head_dim**-0.5
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            self.register_buffer(f"{name}_weight", w[f"{name}.weight"])  # [out, in]
            self.register_buffer(f"{name}_bias", w[f"{name}.bias"])  # [out]
        self.register_buffer("sinks", w["sinks"])  # [Hq] float32

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, attn: AttentionFn, lora: LoraStep | None = None
    ) -> Tensor:
        T = x.shape[0]
        q = self._proj("q_proj", x, lora).view(T, self.n_heads, self.head_dim)
        k = self._proj("k_proj", x, lora).view(T, self.n_kv, self.head_dim)
        v = self._proj("v_proj", x, lora).view(T, self.n_kv, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        o = attn(self.layer, q, k, v, self.sinks, self.window, self.scale)  # [T, Hq, D]
        return self._proj("o_proj", o.reshape(T, -1), lora)  # [T, H]

    def _proj(self, name: str, x: Tensor, lora: LoraStep | None) -> Tensor:
        """x @ W^T + b, plus the LoRA delta (unmerged, as PEFT's lora.Linear adds it) if adapted."""
        y = F.linear(x, getattr(self, f"{name}_weight"), getattr(self, f"{name}_bias"))
        delta = None if lora is None else lora.linear(name, x)
        return y if delta is None else y + delta


def swiglu(h: Tensor, alpha: float, limit: float) -> Tensor:
    """[N, 2I] with gate/up interleaved (even/odd columns) -> [N, I]: clamped SwiGLU, linear part + 1."""
    gate, up = h[:, 0::2], h[:, 1::2]
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(alpha * gate))


class Experts(nn.Module):
    """E expert MLPs; MXFP4 ones stay packed and are decoded one expert at a time, when used."""

    def __init__(self, cfg: ModelConfig, w: dict[str, Tensor], dtype: torch.dtype):
        super().__init__()
        self.packed, self.dtype = cfg.quant_method == "mxfp4", dtype
        self.alpha, self.limit = cfg.swiglu_alpha, cfg.swiglu_limit
        if self.packed:
            self.register_buffer("gate_up_blocks", w["gate_up_proj_blocks"])  # [E, 2I, H/32, 16] uint8
            self.register_buffer("gate_up_scales", w["gate_up_proj_scales"])  # [E, 2I, H/32] uint8
            self.register_buffer("down_blocks", w["down_proj_blocks"])  # [E, H, I/32, 16] uint8
            self.register_buffer("down_scales", w["down_proj_scales"])  # [E, H, I/32] uint8
        else:
            self.register_buffer("gate_up_dense", w["gate_up_proj"])  # [E, H, 2I]
            self.register_buffer("down_dense", w["down_proj"])  # [E, I, H]
        self.register_buffer("gate_up_bias", w["gate_up_proj_bias"])  # [E, 2I]
        self.register_buffer("down_bias", w["down_proj_bias"])  # [E, H]

    def weights(self, e: int) -> tuple[Tensor, Tensor]:
        """Expert e's (gate_up [H, 2I], down [I, H]) in the compute dtype, for x @ w."""
        if not self.packed:
            return self.gate_up_dense[e], self.down_dense[e]
        gate_up = mxfp4.dequantize(self.gate_up_blocks[e], self.gate_up_scales[e], self.dtype)  # [2I, H]
        down = mxfp4.dequantize(self.down_blocks[e], self.down_scales[e], self.dtype)  # [H, I]
        return gate_up.t(), down.t()

    def forward(self, e: int, x: Tensor, lora: LoraStep | None = None, tok: Tensor | None = None) -> Tensor:
        """x [N, H] (the tokens tok [N] routed to expert e) -> [N, H]. LoRA deltas (gptoss.lora)
        join before the SwiGLU and before the routing weights."""
        gate_up, down = self.weights(e)
        h = torch.addmm(self.gate_up_bias[e], x, gate_up)  # [N, 2I]
        if lora is not None and (d := lora.expert("gate_up_proj", e, x, tok)) is not None:
            h = h + d
        act = swiglu(h, self.alpha, self.limit)  # [N, I]
        y = torch.addmm(self.down_bias[e], act, down)  # [N, H]
        if lora is not None and (d := lora.expert("down_proj", e, act, tok)) is not None:
            y = y + d
        return y


class MoE(nn.Module):
    def __init__(self, cfg: ModelConfig, w: dict[str, Tensor], dtype: torch.dtype):
        super().__init__()
        self.top_k = cfg.num_experts_per_tok
        self.register_buffer("router_weight", w["router.weight"])  # [E, H]
        self.register_buffer("router_bias", w["router.bias"])  # [E]
        self.experts = Experts(cfg, _under(w, "experts."), dtype)

    def forward(self, x: Tensor, lora: LoraStep | None = None) -> Tensor:
        """x [T, H] -> [T, H]: top-k experts per token, weighted by a softmax over their logits."""
        logits = F.linear(x, self.router_weight, self.router_bias)  # [T, E]
        return mix_experts(x, logits, self.top_k, self.experts, lora)


def mix_experts(
    x: Tensor, logits: Tensor, top_k: int, experts: Experts, lora: LoraStep | None = None
) -> Tensor:
    """x [T, H], router logits [T, E] -> [T, H]: MoE.forward after its router (vLLM's plugin enters here)."""
    top_logits, top_idx = torch.topk(logits, top_k, dim=-1)  # [T, k]
    top_w = torch.softmax(top_logits.float(), dim=-1)  # [T, k]
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)  # [T, H]
    for e in torch.unique(top_idx).tolist():  # only the experts these tokens use
        tok, slot = torch.where(top_idx == e)  # [N], [N]
        y = experts(e, x[tok], lora, tok)  # [N, H]
        out.index_add_(0, tok, y.float() * top_w[tok, slot, None])
    return out.to(x.dtype)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, w: dict[str, Tensor], dtype: torch.dtype):
        super().__init__()
        self.eps = cfg.rms_norm_eps
        self.register_buffer("input_norm", w["input_layernorm.weight"])  # [H] float32
        self.register_buffer("post_attention_norm", w["post_attention_layernorm.weight"])  # [H] float32
        self.attn = Attention(cfg, layer, _under(w, "self_attn."))
        self.mlp = MoE(cfg, _under(w, "mlp."), dtype)

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, attn: AttentionFn, lora: LoraStep | None = None
    ) -> Tensor:
        x = x + self.attn(rms_norm(x, self.input_norm, self.eps), cos, sin, attn, lora)
        return x + self.mlp(rms_norm(x, self.post_attention_norm, self.eps), lora)


class GptOss(nn.Module):
    """model(input_ids [T], positions [T], attn) -> hidden [T, H]; compute_logits(hidden) -> [N, V] fp32."""

    def __init__(self, cfg: ModelConfig, weights: dict[str, Tensor], dtype: torch.dtype):
        super().__init__()
        self.cfg, self.dtype = cfg, dtype
        self.register_buffer("embed", weights["model.embed_tokens.weight"])  # [V, H]
        self.layers = nn.ModuleList()
        for i in range(cfg.num_hidden_layers):
            self.layers.append(Block(cfg, i, _under(weights, f"model.layers.{i}."), dtype))
        self.register_buffer("norm", weights["model.norm.weight"])  # [H] float32
        self.register_buffer("lm_head", weights["lm_head.weight"])  # [V, H]
        self.rope = Rope(cfg).to(self.embed.device)

    @classmethod
    def from_checkpoint(
        cls, path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.bfloat16
    ) -> GptOss:
        cfg, weights = load(path, device, dtype)
        return cls(cfg, weights, dtype).eval()

    @torch.inference_mode()
    def forward(
        self,
        input_ids: Tensor,
        positions: Tensor,
        attn: AttentionFn,
        lora: LoraStack | None = None,
        lora_index: Tensor | None = None,
    ) -> Tensor:
        """input_ids, positions [T] int64 -> hidden [T, H] after the final norm. With `lora`, token t
        goes through adapter lora_index[t] (0: none)."""
        cos, sin = self.rope(positions)  # [T, D/2] each
        x = F.embedding(input_ids, self.embed)  # [T, H]
        mask = None if lora is None else lora.mask(lora_index)  # [T, W]
        for i, block in enumerate(self.layers):
            x = block(x, cos, sin, attn, None if lora is None else lora.step(i, mask))
        return rms_norm(x, self.norm, self.cfg.rms_norm_eps)

    @torch.inference_mode()
    def compute_logits(self, hidden: Tensor) -> Tensor:
        """hidden [N, H] -> logits [N, V] float32 (untied lm_head)."""
        return F.linear(hidden, self.lm_head).float()

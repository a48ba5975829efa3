"""Write a random-weight gpt-oss checkpoint in the exact released HF layout (tiny, 20b, 120b).

    python -m gptoss.tools.make_checkpoint --preset tiny --out /tmp/gptoss-tiny
    python -m gptoss.tools.make_checkpoint --preset 20b --out ~/gptoss20b-random --device cuda
    python -m gptoss.tools.make_checkpoint --preset 20b --out ~/gptoss20b-calm --device cuda --init calm

Every tensor comes from its own generator, seeded by (seed, tensor name), so a tensor does not
depend on sharding or on --layers (it does on --device: cpu and cuda generators differ); and
--bf16-experts writes the same model with its experts dequantized (the same logits, bf16 layout).
--init calm draws a model conditioned like a trained one for greedy-agreement runs (see INITS).
Shards are generated one at a time on --device and written from host memory; the whole model is
never held at once: generating the 20b preset on an H100 takes ~18 s and peaks at 8.5 GB of host
memory (a shard plus its serialized copy).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import Tensor

from gptoss import mxfp4
from gptoss.checkpoint import INDEX_FILE, SINGLE_FILE, TensorSpec, global_specs, layer_specs, tensor_specs
from gptoss.config import PRESETS, ModelConfig

# preset -> layers per shard (None: one file): shards stay <= ~5 GB, one is held in memory at a time.
LAYERS_PER_SHARD: dict[str, int | None] = {"tiny": None, "20b": 8, "120b": 3}
GENERATION_CONFIG = {
    "bos_token_id": 199998,
    "do_sample": True,
    "eos_token_id": [200002, 199999, 200012],
    "pad_token_id": 199999,
    "transformers_version": "4.55.0.dev0",
}
# The release's expert scales cluster where a 2880-wide dot product stays O(1); bytes 118..122
# (2^-9 .. 2^-5) do that for fan-in 2880. Narrower presets shift the scales up by
# log2(sqrt(2880 / fan_in)) so activations keep the same size (and the SwiGLU clamp still bites).
_SCALE_LO_AT_2880 = 118
_SCALE_SPAN = 5

INITS = ("default", "calm")
# --init calm: a random model conditioned like a trained one, for greedy-agreement runs. The default
# draw is chaotic: every layer adds more than the embedding (residual RMS 1 -> 7 after layer 0), so a
# rounding flips a top-4 expert choice, which changes the residual by O(1) and flips more; its own
# bf16 and float32 references agree on a quarter of argmaxes. Calm keeps every shape and dtype and
# spreads tokens over experts as evenly, but:
# (1) the branch outputs are scaled down, the experts' by 2^-CALM_DOWN_SHIFT and the attention's by
#     2^-CALM_ATTN_SHIFT, so a layer adds a few percent to the residual; the sinks are drawn around
#     CALM_SINK instead of 0, so each takes a visible share of its head's softmax (as a trained
#     model's do) and the attention, at 8x the experts' scale, moves tokens a wrong kernel would flip;
# (2) routing is clear-cut: each token gets a random set S(t) of top-k "expert keys" (random
#     directions, one an expert) added to its embedding, CALM_ROUTE of the row's RMS each, and layer
#     L's router rows are those keys in a permutation of its own, so a token's top-k experts at layer
#     L are pi_L^-1(S(t)) by a margin of several router-logit stds that a rounding does not flip;
# (3) token t's embedding carries the direction of lm_head's row for a fixed random next(t),
#     CALM_PLANT of the row's RMS, so most logits have one clear winner; the layers decide the rest.
CALM_DOWN_SHIFT = 6
CALM_ATTN_SHIFT = 3
CALM_SINK = 4.0
CALM_PLANT = 0.14
CALM_ROUTE = 0.1


def tensor_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _scale_lo(fan_in: int) -> int:
    return _SCALE_LO_AT_2880 + round(0.5 * math.log2(2880 / fan_in))


def _expert_fan_in(name: str, cfg: ModelConfig) -> int:
    """The fan-in of the expert tensor `name`: the hidden size for gate_up, the intermediate for down."""
    return cfg.hidden_size if "gate_up_proj" in name else cfg.intermediate_size


def calm_shift(name: str) -> int:
    """Powers of two by which --init calm scales the tensor `name` down: the tensors whose values a
    layer adds to the residual (o_proj and the experts' down); 0 for any other."""
    if ".self_attn.o_proj." in name:
        return CALM_ATTN_SHIFT
    return CALM_DOWN_SHIFT if ".mlp.experts.down_proj" in name else 0


def draw_shift(name: str, t: Tensor, cfg: ModelConfig) -> int:
    """How many powers of two a branch output (o_proj's weight; the experts' down scales, or the
    bf16 twin's down) sits below make_checkpoint's default draw: 0 for it, calm_shift(name) for calm."""
    if name.endswith("_scales"):  # e8m0 bytes, drawn uniform on _scale_lo .. + _SCALE_SPAN - 1
        return round(_scale_lo(_expert_fan_in(name, cfg)) + (_SCALE_SPAN - 1) / 2 - float(t.float().mean()))
    if ".mlp.experts.down_proj" in name:  # dequantized: random e2m1 codes (mean square 8.5625) x scales
        lo = _scale_lo(_expert_fan_in(name, cfg)) - 127
        want = math.sqrt(8.5625 * sum(4.0**b for b in range(lo, lo + _SCALE_SPAN)) / _SCALE_SPAN)
    else:
        want = 1 / math.sqrt(t.shape[-1])
    return round(math.log2(want / float(t.float().pow(2).mean().sqrt())))


def random_tensor(
    name: str, spec: TensorSpec, cfg: ModelConfig, seed: int, device: str, init: str = "default"
) -> Tensor:
    """One tensor of the random model: bf16, or uint8 for MXFP4 blocks/scales."""
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
    calm = init == "calm"
    if calm and name == "model.embed_tokens.weight":
        return _planted_embedding(spec, cfg, seed, device)
    if calm and name.endswith("mlp.router.weight"):
        return _keyed_router(name, cfg, seed, device)
    g = torch.Generator(device=device)
    g.manual_seed(tensor_seed(seed, name))
    if name.endswith("_blocks"):  # every byte: two uniformly random e2m1 codes
        return torch.randint(0, 256, spec.shape, generator=g, device=device, dtype=torch.uint8)
    if name.endswith("_scales"):
        lo = _scale_lo(_expert_fan_in(name, cfg)) - (calm_shift(name) if calm else 0)
        return torch.randint(lo, lo + _SCALE_SPAN, spec.shape, generator=g, device=device, dtype=torch.uint8)
    t = _normal_tensor(name, spec, cfg, g, device)
    if calm and name.endswith("sinks"):
        return t + CALM_SINK
    return t * 2.0 ** -calm_shift(name) if calm else t


def calm_next_tokens(vocab: int, seed: int, device: str) -> Tensor:
    """next(t) for every token t of the calm draw: a fixed random permutation of the vocabulary."""
    g = torch.Generator(device=device)
    g.manual_seed(tensor_seed(seed, "calm.next_token"))
    return torch.randperm(vocab, generator=g, device=device)


def calm_expert_keys(cfg: ModelConfig, seed: int, device: str) -> Tensor:
    """[E, H] float32: one random direction an expert, scaled to RMS 1."""
    g = torch.Generator(device=device)
    g.manual_seed(tensor_seed(seed, "calm.expert_keys"))
    keys = torch.randn(cfg.num_local_experts, cfg.hidden_size, generator=g, device=device)
    return keys * (math.sqrt(cfg.hidden_size) / keys.norm(dim=-1, keepdim=True))


def calm_expert_sets(cfg: ModelConfig, seed: int, device: str) -> Tensor:
    """[V, top_k]: S(t), the distinct expert keys token t's calm embedding carries."""
    g = torch.Generator(device=device)
    g.manual_seed(tensor_seed(seed, "calm.expert_sets"))
    draw = torch.rand(cfg.vocab_size, cfg.num_local_experts, generator=g, device=device)
    return draw.argsort(-1)[:, : cfg.num_experts_per_tok]


def calm_router_order(name: str, cfg: ModelConfig, seed: int, device: str) -> Tensor:
    """pi_L of the router `name`: its row e is expert key pi_L[e]."""
    g = torch.Generator(device=device)
    g.manual_seed(tensor_seed(seed, "calm.order:" + name))
    return torch.randperm(cfg.num_local_experts, generator=g, device=device)


def _keyed_router(name: str, cfg: ModelConfig, seed: int, device: str) -> Tensor:
    # Row e . key_j / sqrt(H) is ~CALM_ROUTE * sqrt(H) (5.4 at H 2880) for j = pi_L[e] in S(t), N(0, 1)
    # otherwise: the router logits' std of the default draw, with the chosen experts ~5 stds clear.
    keys = calm_expert_keys(cfg, seed, device)[calm_router_order(name, cfg, seed, device)]
    return (keys / math.sqrt(cfg.hidden_size)).to(torch.bfloat16)


def _planted_embedding(spec: TensorSpec, cfg: ModelConfig, seed: int, device: str) -> Tensor:
    """Row t: N(0, 1), plus CALM_PLANT x lm_head's row next(t) and CALM_ROUTE x each key of S(t),
    each scaled to RMS 1."""
    head = random_tensor("lm_head.weight", TensorSpec(spec.shape), cfg, seed, device).float()
    row = head[calm_next_tokens(spec.shape[0], seed, device)]
    del head
    row *= CALM_PLANT * math.sqrt(spec.shape[1]) / row.norm(dim=-1, keepdim=True)
    keys = calm_expert_keys(cfg, seed, device)
    for j in calm_expert_sets(cfg, seed, device).t():  # one of each token's k keys at a time
        row += CALM_ROUTE * keys[j]
    g = torch.Generator(device=device)
    g.manual_seed(tensor_seed(seed, "model.embed_tokens.weight"))
    row += torch.randn(spec.shape, generator=g, device=device, dtype=torch.float32)
    return row.to(torch.bfloat16)


def _normal_tensor(name: str, spec: TensorSpec, cfg: ModelConfig, g: torch.Generator, device: str) -> Tensor:
    def normal(std: float, mean: float = 0.0) -> Tensor:
        x = torch.randn(spec.shape, generator=g, device=device, dtype=torch.float32)
        return (x * std + mean).to(torch.bfloat16)

    if name.endswith("norm.weight"):
        return normal(0.1, mean=1.0)
    if name.endswith("sinks"):
        return normal(1.0)
    if name.endswith("bias"):
        return normal(0.02)
    if name == "model.embed_tokens.weight":
        return normal(1.0)
    if name == "lm_head.weight":
        # Logits of std ~4 (the default draw's greedy tokens are still near-ties: see INITS).
        return normal(4.0 / math.sqrt(cfg.hidden_size))
    return normal(1.0 / math.sqrt(spec.shape[-1]))  # a linear layer's [out, in] weight


def _dense_experts(name: str, cfg: ModelConfig, seed: int, device: str, init: str = "default") -> Tensor:
    """bf16 experts in transformers' orientation ([E, H, 2I] / [E, I, H]) decoded from the MXFP4 draw."""
    packed_cfg = replace(cfg, quant_method="mxfp4")
    layer = int(name.split(".")[2])
    specs = layer_specs(packed_cfg, layer)
    blocks = random_tensor(name + "_blocks", specs[name + "_blocks"], packed_cfg, seed, device, init)
    scales = random_tensor(name + "_scales", specs[name + "_scales"], packed_cfg, seed, device, init)
    # One expert at a time: the 120b gate_up of a layer would be 8.5 GB in float32 at once.
    dense = [
        mxfp4.dequantize(blocks[e], scales[e], torch.bfloat16).t() for e in range(cfg.num_local_experts)
    ]  # [in, out] each
    return torch.stack(dense)


def shard_plan(cfg: ModelConfig, layers_per_shard: int | None) -> list[dict[str, TensorSpec]]:
    """Shard 0 holds embeddings, final norm and lm_head; then groups of whole layers.

    layers_per_shard None: everything in one file (model.safetensors, no index).
    """
    if layers_per_shard is None:
        return [tensor_specs(cfg)]
    shards = [global_specs(cfg)]
    for start in range(0, cfg.num_hidden_layers, layers_per_shard):
        shard: dict[str, TensorSpec] = {}
        for layer in range(start, min(start + layers_per_shard, cfg.num_hidden_layers)):
            shard |= layer_specs(cfg, layer)
        shards.append(shard)
    return shards


def shard_names(n: int) -> list[str]:
    return [SINGLE_FILE] if n == 1 else [f"model-{i:05d}-of-{n - 1:05d}.safetensors" for i in range(n)]


def spec_nbytes(spec: TensorSpec) -> int:
    return math.prod(spec.shape) * (1 if spec.packed else 2)


def write_checkpoint(
    cfg: ModelConfig,
    out: str | Path,
    *,
    seed: int = 0,
    device: str = "cpu",
    layers_per_shard: int | None = None,
    init: str = "default",
    log=None,
) -> Path:
    """Generate and write the checkpoint of `cfg` into `out` (created; must not hold one already)."""
    out = Path(out)
    if (out / "config.json").exists():
        raise FileExistsError(f"{out} already holds a checkpoint (config.json exists)")
    out.mkdir(parents=True, exist_ok=True)
    plan = shard_plan(cfg, layers_per_shard)
    files = shard_names(len(plan))
    t0 = time.perf_counter()
    weight_map: dict[str, str] = {}
    total = 0
    for fname, specs in zip(files, plan, strict=True):
        tensors: dict[str, Tensor] = {}
        for name, spec in specs.items():
            if cfg.quant_method is None and name.endswith(("gate_up_proj", "down_proj")):
                t = _dense_experts(name, cfg, seed, device, init)
            else:
                t = random_tensor(name, spec, cfg, seed, device, init)
            tensors[name] = t.cpu().contiguous()
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        total += nbytes
        weight_map |= dict.fromkeys(tensors, fname)
        del tensors
        if log:
            log(f"{fname}: {nbytes / 1e9:.3f} GB at {time.perf_counter() - t0:.1f} s")
    if len(files) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2) + "\n")
    # config.json last: its presence marks a complete checkpoint.
    (out / "config.json").write_text(json.dumps(cfg.to_hf(), indent=2) + "\n")
    if log:
        log(
            f"wrote {len(weight_map)} tensors, {total / 1e9:.3f} GB in {len(files)} file(s), "
            f"{cfg.num_hidden_layers} layers x {cfg.num_local_experts} experts, to {out} "
            f"in {time.perf_counter() - t0:.1f} s"
        )
    return out


def preset_config(preset: str, layers: int | None = None, bf16_experts: bool = False) -> ModelConfig:
    cfg = PRESETS[preset]
    if layers is not None:
        cfg = cfg.with_layers(layers)
    return replace(cfg, quant_method=None) if bf16_experts else cfg


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m gptoss.tools.make_checkpoint", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--preset", choices=sorted(PRESETS), required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=None, help="default: the preset's")
    ap.add_argument(
        "--bf16-experts", action="store_true", help="store experts as bf16 tensors (no quantization_config)"
    )
    ap.add_argument("--device", default="cpu", help="where tensors are generated: cpu or cuda")
    ap.add_argument(
        "--init",
        choices=INITS,
        default="default",
        help="calm: outputs scaled down and next tokens planted, for greedy-agreement runs (see INITS)",
    )
    ap.add_argument("--layers-per-shard", type=int, default=None)
    ap.add_argument("--dry-run", action="store_true", help="print the shard plan, write nothing")
    args = ap.parse_args(argv)
    if args.layers is not None and args.layers < 1:
        ap.error(f"--layers must be >= 1, got {args.layers}")
    if args.layers_per_shard is not None and args.layers_per_shard < 1:
        ap.error(f"--layers-per-shard must be >= 1, got {args.layers_per_shard}")
    cfg = preset_config(args.preset, args.layers, args.bf16_experts)
    per_shard = args.layers_per_shard or LAYERS_PER_SHARD[args.preset]
    if args.dry_run:
        plan = shard_plan(cfg, per_shard)
        for fname, specs in zip(shard_names(len(plan)), plan, strict=True):
            print(f"{fname}: {len(specs)} tensors, {sum(map(spec_nbytes, specs.values())):,} bytes")
        total = sum(spec_nbytes(s) for specs in plan for s in specs.values())
        print(f"total: {sum(map(len, plan))} tensors, {total:,} bytes")
        return 0
    write_checkpoint(
        cfg,
        args.out,
        seed=args.seed,
        device=args.device,
        layers_per_shard=per_shard,
        init=args.init,
        log=lambda msg: print(msg, flush=True),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

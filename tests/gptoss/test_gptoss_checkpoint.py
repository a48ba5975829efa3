import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from gptoss import mxfp4
from gptoss.checkpoint import CheckpointError, load, tensor_specs
from gptoss.config import PRESETS
from gptoss.tools.make_checkpoint import main, preset_config, write_checkpoint

# A one-layer, 256-token-vocab model: the loader does not care about size, and it writes in ms.
MICRO = replace(PRESETS["tiny"], vocab_size=256).with_layers(1)


def test_tiny_loads_with_experts_packed(tiny_checkpoint: Path):
    assert sorted(p.name for p in tiny_checkpoint.iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
    ]
    cfg, w = load(tiny_checkpoint, dtype=torch.bfloat16)
    assert cfg == PRESETS["tiny"]
    assert len(w) == 3 + 19 * cfg.num_hidden_layers
    x = "model.layers.3.mlp.experts."
    assert w[x + "gate_up_proj_blocks"].dtype == torch.uint8
    assert w[x + "gate_up_proj_blocks"].shape == (8, 128, 2, 16)  # [E, 2I, H/32, 16]
    assert w[x + "gate_up_proj_scales"].shape == (8, 128, 2)
    assert w[x + "down_proj_blocks"].shape == (8, 64, 2, 16)  # [E, H, I/32, 16]
    assert w[x + "down_proj_bias"].dtype == torch.bfloat16
    assert w["model.layers.0.self_attn.q_proj.weight"].shape == (256, 64)  # [Hq*D, H]
    assert w["model.layers.0.self_attn.q_proj.weight"].dtype == torch.bfloat16
    # Norms and sinks stay float32 whatever the compute dtype, like the release's fp32 modules.
    assert w["model.norm.weight"].dtype == torch.float32
    assert w["model.layers.0.self_attn.sinks"].dtype == torch.float32
    scales = w[x + "down_proj_scales"]
    assert 118 <= scales.min() and scales.max() <= 125


def test_same_seed_gives_the_same_tensors_whatever_the_sharding(tmp_path: Path, tiny_checkpoint: Path):
    sharded = write_checkpoint(preset_config("tiny"), tmp_path / "sharded", layers_per_shard=1)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert files == [f"model-0000{i}-of-00004.safetensors" for i in range(5)]
    assert index["weight_map"]["lm_head.weight"] == "model-00000-of-00004.safetensors"
    assert index["weight_map"]["model.layers.2.mlp.router.bias"] == "model-00003-of-00004.safetensors"
    assert index["metadata"]["total_size"] == (
        tiny_checkpoint / "model.safetensors"
    ).stat().st_size - _header_bytes(tiny_checkpoint / "model.safetensors")
    _, a = load(tiny_checkpoint, dtype=torch.float32)
    _, b = load(sharded, dtype=torch.float32)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def _header_bytes(file: Path) -> int:
    with open(file, "rb") as f:
        return 8 + int.from_bytes(f.read(8), "little")


def test_bf16_experts_variant_holds_the_dequantized_mxfp4_weights(tiny_checkpoint, tiny_bf16_checkpoint):
    cfg, packed = load(tiny_checkpoint, dtype=torch.bfloat16)
    cfg16, dense = load(tiny_bf16_checkpoint, dtype=torch.bfloat16)
    assert cfg16 == replace(cfg, quant_method=None)
    assert "quantization_config" not in json.loads((tiny_bf16_checkpoint / "config.json").read_text())
    for layer in range(cfg.num_hidden_layers):
        x = f"model.layers.{layer}.mlp.experts."
        gate_up = mxfp4.dequantize(packed[x + "gate_up_proj_blocks"], packed[x + "gate_up_proj_scales"])
        down = mxfp4.dequantize(packed[x + "down_proj_blocks"], packed[x + "down_proj_scales"])
        assert dense[x + "gate_up_proj"].shape == (8, 64, 128)  # [E, H, 2I], transformers' x @ W
        assert torch.equal(dense[x + "gate_up_proj"], gate_up.transpose(1, 2))
        assert torch.equal(dense[x + "down_proj"], down.transpose(1, 2))
    shared = [k for k in packed if "_blocks" not in k and "_scales" not in k]
    assert all(torch.equal(packed[k], dense[k]) for k in shared)


def test_seed_changes_every_tensor(tmp_path: Path):
    a = load_file(write_checkpoint(MICRO, tmp_path / "a", seed=1) / "model.safetensors")
    b = load_file(write_checkpoint(MICRO, tmp_path / "b", seed=2) / "model.safetensors")
    random = [k for k in a if not k.endswith("_scales")]  # scales take 5 values: collisions happen
    assert all(not torch.equal(a[k], b[k]) for k in random)


def _release_bytes(layers: int, experts: int) -> int:
    # Worked out by hand from the release's shapes: bf16 everything but the MXFP4 experts.
    V, H, I, Hq, Hkv, D = 201088, 2880, 2880, 64, 8, 64
    bf16 = (
        2 * H
        + Hq * D * H
        + Hq * D
        + 2 * (Hkv * D * H + Hkv * D)
        + H * Hq * D
        + H
        + Hq
        + experts * H
        + experts
        + experts * 2 * I
        + experts * H
    )
    u8 = experts * (2 * I * H // 32 * 17 + H * I // 32 * 17)  # 16 block bytes + 1 scale per 32
    return 2 * (2 * V * H + H) + layers * (2 * bf16 + u8)


@pytest.mark.parametrize("preset, tensors, layers, experts", [("20b", 459, 24, 32), ("120b", 687, 36, 128)])
def test_dry_run_plans_the_release_sizes(preset, tensors, layers, experts, tmp_path, capsys):
    assert main(["--preset", preset, "--out", str(tmp_path / "x"), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == f"total: {tensors} tensors, {_release_bytes(layers, experts):,} bytes"
    assert not (tmp_path / "x").exists()
    if preset == "20b":  # the released openai/gpt-oss-20b index says total_size 13761264768
        assert _release_bytes(24, 32) == 13_761_264_768
        assert lines[0] == "model-00000-of-00003.safetensors: 3 tensors, 2,316,539,520 bytes"


def test_cli_writes_a_checkpoint_that_loads(tmp_path: Path, capsys):
    out = tmp_path / "one-layer"
    assert (
        main(["--preset", "tiny", "--layers", "1", "--bf16-experts", "--seed", "3", "--out", str(out)]) == 0
    )
    assert "wrote 20 tensors" in capsys.readouterr().out
    cfg, w = load(out)
    assert cfg == replace(PRESETS["tiny"].with_layers(1), quant_method=None)
    assert w["model.layers.0.mlp.experts.gate_up_proj"].shape == (8, 64, 128)
    with pytest.raises(FileExistsError, match="already holds a checkpoint"):
        write_checkpoint(cfg, out)


# ---- errors -----------------------------------------------------------------------------------


@pytest.fixture
def micro(tmp_path: Path) -> Path:
    return write_checkpoint(MICRO, tmp_path / "micro")


def _rewrite(path: Path, edit) -> None:
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, path / "model.safetensors")


def _error(path: Path) -> str:
    with pytest.raises(CheckpointError) as e:
        load(path)
    return str(e.value)


def test_missing_tensor_is_named(micro: Path):
    _rewrite(micro, lambda t: t.pop("model.layers.0.mlp.router.bias"))
    assert _error(micro) == f"checkpoint {micro}: missing tensor 'model.layers.0.mlp.router.bias'"


def test_several_missing_tensors_are_counted(micro: Path):
    def drop(t):
        for k in [k for k in t if "self_attn" in k]:
            del t[k]

    _rewrite(micro, drop)
    assert (
        _error(micro)
        == f"checkpoint {micro}: missing tensor 'model.layers.0.self_attn.q_proj.weight' (and 8 more)"
    )


def test_wrong_shape_is_reported(micro: Path):
    _rewrite(
        micro, lambda t: t.update({"model.layers.0.self_attn.sinks": torch.zeros(8, dtype=torch.bfloat16)})
    )
    assert _error(micro) == (
        f"checkpoint {micro}: tensor 'model.layers.0.self_attn.sinks' has shape (8,), expected (4,)"
    )


def test_float_where_mxfp4_blocks_belong_is_refused(micro: Path):
    name = "model.layers.0.mlp.experts.down_proj_blocks"
    _rewrite(micro, lambda t: t.update({name: t[name].to(torch.bfloat16)}))
    assert _error(micro) == f"checkpoint {micro}: tensor '{name}' has dtype BF16, expected U8"


def test_unexpected_tensor_is_refused(micro: Path):
    _rewrite(micro, lambda t: t.update({"model.layers.0.mlp.experts.gate_up_proj": torch.zeros(1)}))
    assert _error(micro) == f"checkpoint {micro}: unexpected tensor 'model.layers.0.mlp.experts.gate_up_proj'"


def test_unknown_quant_method_is_refused(micro: Path):
    cfg = json.loads((micro / "config.json").read_text())
    cfg["quantization_config"]["quant_method"] = "fp8"
    (micro / "config.json").write_text(json.dumps(cfg))
    assert _error(micro) == (
        f"checkpoint {micro}: config.json: unknown quant method 'fp8'; "
        "supported: 'mxfp4', or no quantization_config (bf16 experts)"
    )


def test_mxfp4_tensors_under_a_bf16_config_are_refused(micro: Path):
    cfg = json.loads((micro / "config.json").read_text())
    del cfg["quantization_config"]
    (micro / "config.json").write_text(json.dumps(cfg))
    assert (
        _error(micro)
        == f"checkpoint {micro}: missing tensor 'model.layers.0.mlp.experts.gate_up_proj' (and 1 more)"
    )


def test_only_safetensors_are_read(micro: Path):
    (micro / "model.safetensors").rename(micro / "pytorch_model.bin")
    assert _error(micro) == (
        f"checkpoint {micro}: no model.safetensors.index.json or model.safetensors "
        "(only safetensors checkpoints are supported)"
    )


def test_missing_shard_is_named(tmp_path: Path):
    out = write_checkpoint(MICRO, tmp_path / "sharded", layers_per_shard=1)
    (out / "model-00001-of-00001.safetensors").unlink()
    assert _error(out) == (
        f"checkpoint {out}: shard model-00001-of-00001.safetensors listed in "
        "model.safetensors.index.json is missing"
    )


def test_missing_config_is_reported(tmp_path: Path):
    tmp_path.joinpath("empty").mkdir()
    assert (
        _error(tmp_path / "empty")
        == f"checkpoint {tmp_path / 'empty'}: no config.json at {tmp_path / 'empty' / 'config.json'}"
    )


def test_specs_cover_every_written_tensor(micro: Path):
    assert set(load_file(micro / "model.safetensors")) == set(tensor_specs(MICRO))

"""LoRA: python -m gptoss.make_lora writes PEFT's exact format; the engine with an adapter gives
transformers + PEFT's greedy tokens (tiny checkpoint, float32), also in a batch that mixes adapters;
bad adapters fail with messages that name the problem."""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from gptoss.engine import EngineConfig, LLMEngine
from gptoss.lora import LoraError, load_adapter
from gptoss.sampling import SamplingParams
from gptoss.tools.make_checkpoint import preset_config, write_checkpoint
from gptoss.tools.make_lora import adapter_tensors, main, write_adapter
from tests.gptoss.lorakit import hf_greedy, hf_model

pytest.importorskip("peft")
N = 10
GREEDY = SamplingParams(max_new_tokens=N, temperature=0.0, ignore_eos=True)


def prompts_of(lengths, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(199000) for _ in range(n)] for n in lengths]


PROMPTS = prompts_of([4, 37, 150], seed=5)  # 150 > the 128-token sliding window


@pytest.fixture(scope="module")
def engine(tiny_checkpoint, tiny_loras):
    cfg = EngineConfig(
        tiny_checkpoint,
        dtype="float32",
        kv_cache_tokens=2048,
        lora=(f"a={tiny_loras[0]}", f"b={tiny_loras[1]}"),
    )
    return LLMEngine(cfg)


@pytest.mark.parametrize("which", [0, 1])
def test_engine_greedy_equals_transformers_peft(engine, tiny_checkpoint, tiny_loras, which):
    name = "ab"[which]
    got = engine.generate(PROMPTS, GREEDY, name)
    assert got == hf_greedy(hf_model(tiny_checkpoint, tiny_loras[which]), PROMPTS, N)
    base = engine.generate(PROMPTS, GREEDY)
    assert all(g != b for g, b in zip(got, base, strict=True))  # the adapter is applied


def test_reference_model_logits_match_peft(ref_fp32, tiny_checkpoint, tiny_loras):
    """The oracle's MoE (experts decoded per use, not the engine's DenseMoE) with each adapter:
    fp32 logits within 1e-4 of max|logit| (measured ~2e-6) of transformers + PEFT's."""
    from gptoss.attention_ref import DenseAttention
    from gptoss.lora_stack import LoraStack

    stack = LoraStack.load(tuple(map(str, tiny_loras)), ref_fp32.cfg, torch.device("cpu"), torch.float32)
    ids = torch.tensor(PROMPTS[2])
    for i, path in enumerate(tiny_loras, start=1):
        with torch.no_grad():
            want = hf_model(tiny_checkpoint, path)(ids[None]).logits[0]
        index = torch.full((len(ids),), i)
        got = ref_fp32.compute_logits(ref_fp32(ids, torch.arange(len(ids)), DenseAttention(), stack, index))
        assert ((got - want).abs().max() / want.abs().max()).item() <= 1e-4


def test_a_batch_mixing_adapters_gives_each_sequence_its_own_tokens(engine):
    alone = {n: engine.generate(PROMPTS, GREEDY, n) for n in ("a", "b", None)}
    mixed = engine.generate(PROMPTS * 2, GREEDY, ["a", "b", None, None, "a", "b"])
    assert mixed == [
        alone["a"][0],
        alone["b"][1],
        alone[None][2],
        alone[None][0],
        alone["a"][1],
        alone["b"][2],
    ]
    with pytest.raises(ValueError, match=r"unknown LoRA adapter 'c'; loaded: a, b"):
        engine.add("x", [1, 2], GREEDY, "c")


def test_an_engine_without_adapters_refuses_a_request_naming_one(tiny_checkpoint):
    eng = LLMEngine(EngineConfig(tiny_checkpoint, dtype="float32", kv_cache_tokens=512))
    with pytest.raises(
        ValueError, match=r"LoRA adapter 'a' requested, but the engine has none loaded \(--lora\)"
    ):
        eng.add("x", [1, 2], GREEDY, "a")


def test_make_lora_writes_what_peft_writes(tiny_checkpoint, tmp_path):
    """Same files, keys, shapes and config keys as get_peft_model(...).save_pretrained."""
    import peft

    ours = write_adapter(tiny_checkpoint, tmp_path / "ours", 4, seed=7)
    conf = json.loads((ours / "adapter_config.json").read_text())
    pm = peft.get_peft_model(
        hf_model(tiny_checkpoint),
        peft.LoraConfig(
            r=4,
            lora_alpha=8,
            target_modules=conf["target_modules"],
            target_parameters=conf["target_parameters"],
            task_type="CAUSAL_LM",
        ),
    )
    pm.save_pretrained(tmp_path / "peft")
    theirs = tmp_path / "peft"
    want, got = load_file(theirs / "adapter_model.safetensors"), load_file(ours / "adapter_model.safetensors")
    assert {k: tuple(v.shape) for k, v in got.items()} == {k: tuple(v.shape) for k, v in want.items()}
    assert len(got) == 4 * 12 and all(v.dtype == torch.bfloat16 for v in got.values())
    peft_conf = json.loads((theirs / "adapter_config.json").read_text())
    assert set(conf) == set(peft_conf) and conf["peft_version"] == peft.__version__
    same = ("r", "lora_alpha", "target_parameters", "peft_type", "task_type", "use_rslora", "bias")
    assert {k: conf[k] for k in same} == {k: peft_conf[k] for k in same}
    assert sorted(conf["target_modules"]) == sorted(peft_conf["target_modules"])


def test_make_lora_cli(tiny_checkpoint, tmp_path, capsys):
    assert (
        main(
            [
                "--model",
                str(tiny_checkpoint),
                "--rank",
                "2",
                "--out",
                str(tmp_path / "a"),
                "--targets",
                "attn",
            ]
        )
        == 0
    )
    assert "wrote a rank-2 LoRA adapter (attn)" in capsys.readouterr().out
    keys = load_file(tmp_path / "a" / "adapter_model.safetensors")
    assert len(keys) == 4 * 4 * 2 and not any("experts" in k for k in keys)
    with pytest.raises(SystemExit):
        main(["--model", str(tiny_checkpoint), "--rank", "65", "--out", str(tmp_path / "b")])
    assert "--rank must be in [1, 64], got 65" in capsys.readouterr().err


# ---- bad adapters ------------------------------------------------------------------------------


@pytest.fixture()
def adapter(tiny_checkpoint, tiny_loras, tmp_path) -> Path:
    """A copy of the rank-8 adapter to spoil."""
    return Path(shutil.copytree(tiny_loras[0], tmp_path / "ad"))


def edit_config(path: Path, **changes) -> None:
    conf = json.loads((path / "adapter_config.json").read_text())
    (path / "adapter_config.json").write_text(json.dumps(conf | changes))


def error_of(spec, tiny_checkpoint) -> str:
    from gptoss.checkpoint import load_config

    with pytest.raises(LoraError) as e:
        load_adapter(str(spec), load_config(tiny_checkpoint))
    return str(e.value)


def test_missing_folder_and_files(adapter, tiny_checkpoint, tmp_path):
    assert error_of(tmp_path / "nope", tiny_checkpoint) == f"LoRA adapter {tmp_path / 'nope'}: no such folder"
    (adapter / "adapter_model.safetensors").rename(adapter / "adapter_model.bin")
    assert error_of(adapter, tiny_checkpoint) == (
        f"LoRA adapter {adapter}: adapter_model.safetensors is missing (only safetensors adapters are read)"
    )
    (adapter / "adapter_config.json").unlink()
    assert error_of(adapter, tiny_checkpoint) == f"LoRA adapter {adapter}: adapter_config.json is missing"


def test_rank_mismatch(adapter, tiny_checkpoint):
    edit_config(adapter, r=16)
    key = "base_model.model.model.layers.0.self_attn.q_proj.lora_"
    assert error_of(f"x={adapter}", tiny_checkpoint) == (
        f"LoRA adapter {adapter}: rank mismatch: adapter_config.json gives layer 0 q_proj rank 16, so "
        f"{key}A.weight should have 16 rows and {key}B.weight 16 columns, but they are [8, 64] and [256, 8]"
    )


def test_rank_above_64(tiny_checkpoint, tmp_path):
    from gptoss.checkpoint import load_config

    path = tmp_path / "r65"
    path.mkdir()
    tensors = adapter_tensors(load_config(tiny_checkpoint), 65, 130, ("attn",), 0)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 65, "lora_alpha": 130}))
    assert error_of(path, tiny_checkpoint) == f"LoRA adapter {path}: rank 65 of layer 0 q_proj exceeds 64"


def test_target_modules_the_model_lacks(adapter, tiny_checkpoint):
    edit_config(adapter, target_modules=["q_proj", "gate_proj"])
    assert error_of(adapter, tiny_checkpoint) == (
        f"LoRA adapter {adapter}: target module 'gate_proj' (target_modules) is not a module of gpt-oss; "
        "was the adapter made for another model?"
    )
    edit_config(adapter, target_modules=["q_proj"])
    tensors = load_file(adapter / "adapter_model.safetensors")
    tensors["base_model.model.model.layers.1.mlp.gate_proj.lora_A.weight"] = torch.zeros(8, 64)
    save_file(tensors, str(adapter / "adapter_model.safetensors"))
    assert error_of(adapter, tiny_checkpoint) == (
        f"LoRA adapter {adapter}: it targets model.layers.1.mlp.gate_proj, which gpt-oss does not have; "
        "was the adapter made for another model?"
    )


def test_adapters_of_another_base_model(tiny_checkpoint, tmp_path):
    wide = write_checkpoint(replace(preset_config("tiny"), hidden_size=96), tmp_path / "wide")
    deep = write_checkpoint(preset_config("tiny", layers=6), tmp_path / "deep")
    for ckpt in (wide, deep):
        write_adapter(ckpt, tmp_path / f"lora-{ckpt.name}", 4)
    key = "base_model.model.model.layers.0.self_attn.q_proj.lora_"
    assert error_of(tmp_path / "lora-wide", tiny_checkpoint) == (
        f"LoRA adapter {tmp_path / 'lora-wide'}: {key}A.weight is [4, 96] and {key}B.weight [256, 4], but "
        f"this model's layer 0 q_proj maps 64 -> 256 features: the adapter was made for another base model "
        f"('{wide.resolve()}')"
    )
    assert error_of(tmp_path / "lora-deep", tiny_checkpoint) == (
        f"LoRA adapter {tmp_path / 'lora-deep'}: it adapts layer 4 but the model has 4 layers: the adapter "
        f"was made for another base model ('{deep.resolve()}')"
    )


def test_the_engine_checks_adapters_before_loading_weights(tiny_checkpoint, tmp_path, monkeypatch):
    from gptoss import model_runner

    def never(*a, **k):
        raise AssertionError("the weights were loaded before the adapter was checked")

    monkeypatch.setattr(model_runner.GptOss, "from_checkpoint", never)
    with pytest.raises(LoraError, match="no such folder"):
        LLMEngine(EngineConfig(tiny_checkpoint, lora=(str(tmp_path / "nope"),)))


def test_lora_flag_values():
    with pytest.raises(ValueError, match="lora: two adapters are named 'x'; name them NAME=PATH"):
        EngineConfig(lora=("x=/a", "/b/x"))
    with pytest.raises(ValueError, match="lora '=/a': expected NAME=PATH or PATH"):
        EngineConfig(lora=("=/a",))

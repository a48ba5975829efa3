"""Helpers of the LoRA tests: transformers + PEFT, the oracle for an adapter's greedy tokens."""

from __future__ import annotations

from pathlib import Path

import torch

STOP_IDS = [200002, 200012, 199999]  # the harness's stop ids: a request ends at one, keeping it


def hf_model(ckpt: Path, adapter: Path | None = None):
    """transformers' GptOssForCausalLM on the MXFP4 checkpoint in float32 (as tests/gptoss/conftest.py's
    hf_fp32, but a fresh copy: PEFT wraps the modules it adapts in place), with `adapter` loaded
    unchanged through PeftModel.from_pretrained."""
    import transformers

    model = transformers.GptOssForCausalLM.from_pretrained(
        ckpt,
        dtype=torch.float32,
        quantization_config=transformers.Mxfp4Config(dequantize=True),
        experts_implementation="eager",
    ).float()
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    return model.eval()


def hf_greedy(model, prompts: list[list[int]], max_new: int, stop: bool = False) -> list[list[int]]:
    """Greedy continuations, one prompt at a time; `stop`: end at (and keep) a harness stop id."""
    out = []
    for p in prompts:
        with torch.no_grad():
            ids = model.generate(
                input_ids=torch.tensor([p]),
                attention_mask=torch.ones(1, len(p), dtype=torch.long),
                max_new_tokens=max_new,
                min_new_tokens=None if stop else max_new,
                do_sample=False,
                eos_token_id=STOP_IDS if stop else None,
                pad_token_id=199999,
            )
        out.append(ids[0, len(p) :].tolist())
    return out

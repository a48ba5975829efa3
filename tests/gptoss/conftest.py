"""Session fixtures of the engine tests: the models built on the tiny checkpoint (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="session")
def ref_fp32(tiny_checkpoint: Path):
    from gptoss.model import GptOss

    return GptOss.from_checkpoint(tiny_checkpoint, dtype=torch.float32)


@pytest.fixture(scope="session")
def hf_fp32(tiny_checkpoint: Path):
    """transformers' GptOssForCausalLM on the unchanged tiny checkpoint, in float32.

    Without the `kernels` package transformers cannot run MXFP4 on CPU, so it is asked to
    dequantize (Mxfp4Config(dequantize=True)); it dequantizes to bf16, exact for MXFP4 values,
    and .float() makes every parameter float32.
    """
    transformers = pytest.importorskip("transformers")
    model = transformers.GptOssForCausalLM.from_pretrained(
        tiny_checkpoint,
        dtype=torch.float32,
        quantization_config=transformers.Mxfp4Config(dequantize=True),
        experts_implementation="eager",
    )
    return model.float().eval()

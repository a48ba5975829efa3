"""bench/profile_gpu.py's chain attribution: what each kernel adds to the stream's span, so that a
profile taken with PDL on (kernels launched early, waiting inside) ranks kernels by their cost in
the step rather than by durations that include those waits."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from profile_gpu import chain  # noqa: E402


def _span(spans):
    return max(e for _, e, _ in spans) - min(s for s, _, _ in spans)


@pytest.mark.parametrize(
    ("spans", "added", "idle"),
    [
        # one after another with a 2 µs launch gap
        ([(0.0, 10.0, "a"), (12.0, 20.0, "b")], {"a": 10.0, "b": 8.0}, 2.0),
        # PDL: b starts at 2 and waits for a inside; it adds only what runs past a's end
        ([(0.0, 10.0, "a"), (2.0, 15.0, "b")], {"a": 10.0, "b": 5.0}, 0.0),
        # a kernel wholly inside another adds nothing
        ([(0.0, 10.0, "a"), (3.0, 6.0, "b")], {"a": 10.0, "b": 0.0}, 0.0),
        # a name's calls add up, given out of order
        ([(9.0, 12.0, "a"), (0.0, 5.0, "a"), (5.0, 9.0, "b")], {"a": 8.0, "b": 4.0}, 0.0),
        # early starts behind a long kernel: each adds its tail past the frontier
        (
            [(0.0, 10.0, "a"), (1.0, 11.0, "b"), (1.5, 14.0, "c"), (20.0, 21.0, "a")],
            {"a": 11.0, "b": 1.0, "c": 3.0},
            6.0,
        ),
    ],
)
def test_chain_attributes_the_span(spans, added, idle):
    got, gap = chain(spans)
    assert got == added
    assert gap == idle
    assert sum(got.values()) + gap == _span(spans)


def test_chain_of_nothing():
    assert chain([]) == ({}, 0.0)


def test_an_ncu_runs_cache_holds_its_batch_and_one_longest_sequence(tiny_checkpoint: Path):
    """profile_gpu.py --ncu sizes the KV cache for what it profiles (ncu's replay needs the room a
    cache sized from free memory would take); the engine must still accept it at the run's
    max_model_len, and the cache is no bigger than that asks."""
    from argparse import Namespace

    from profile_gpu import ncu_kv_tokens

    from gptoss.engine import EngineConfig, LLMEngine

    args = Namespace(prompt_len=128, steps=1, max_num_batched_tokens=16384)
    tokens = ncu_kv_tokens([1], args, 4096)
    assert tokens == 4096 + 144
    eng = LLMEngine(
        EngineConfig(model_path=tiny_checkpoint, device="cpu", max_model_len=4096, kv_cache_tokens=tokens)
    )
    assert eng.runner.max_model_len == 4096
    assert eng.runner.kv_cache_tokens <= tokens + 16
    assert ncu_kv_tokens([64], args, 4096) == 64 * (128 + 1 + 8 + 1 + 2) + 64 * 144

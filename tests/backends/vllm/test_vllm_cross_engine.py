"""Cross-engine agreement: greedy tokens of vLLM and of our gptoss engine are the same, request by request.

Both are real engines on the same tiny model, in float32 (vLLM reads the bf16-experts copy, gptoss
the MXFP4 original: the same weights). A mismatch is a bug in one of them, so the failure message
says which one our reference model agrees with, and from which token on.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from harness.config import SamplingParams
from tests.backends.vllm.vllmkit import generate, greedy_reference

N_NEW = 24


@pytest.fixture(scope="module")
def gptoss_engine(checkpoints, loop):
    from gptoss.async_engine import AsyncEngine
    from gptoss.engine import EngineConfig

    # A small step budget, so gptoss prefills the long prompts in chunks while vLLM takes them whole.
    engine = AsyncEngine(
        EngineConfig(
            checkpoints["mxfp4"],
            dtype="float32",
            max_num_seqs=16,
            max_num_batched_tokens=128,
            kv_cache_tokens=16384,
        )
    )
    loop.run(engine.__aenter__(), timeout=300)
    yield engine
    loop.run(engine.__aexit__(None, None, None), timeout=120)


def _gptoss(loop, engine, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    async def one(p):
        out: list[int] = []
        async for delta in engine.generate(p, params):
            out += delta.token_ids
        return out

    async def go():
        return await asyncio.gather(*(one(p) for p in prompts))

    return loop.run(go(), timeout=600)


def _verdict(model_path, prompt: list[int], a: list[int], b: list[int]) -> str:
    ref = greedy_reference(model_path, [prompt], max(len(a), len(b)))[0]
    first = (
        next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
        if a[: len(b)] != b[: len(a)]
        else min(len(a), len(b))
    )
    return (
        f"prompt of {len(prompt)} tokens: first difference at output token {first}; "
        f"vLLM {'agrees' if a == ref[: len(a)] else 'DISAGREES'} with the reference model, "
        f"gptoss {'agrees' if b == ref[: len(b)] else 'DISAGREES'}\n"
        f"  vllm   {a}\n  gptoss {b}\n  ref    {ref}"
    )


def test_greedy_outputs_agree_request_by_request(engine, gptoss_engine, loop, checkpoints):
    rng = random.Random(21)
    lengths = [1, 2, 7, 64, 127, 128, 129, 200, 255, 300, 401, 17, 33, 90, 150, 260]
    prompts = [[rng.randrange(200_000) for _ in range(n)] for n in lengths]
    greedy = SamplingParams(max_new_tokens=N_NEW, temperature=0.0, ignore_eos=True)
    ours = _gptoss(loop, gptoss_engine, prompts, greedy)
    theirs = generate(loop, engine, prompts, greedy)
    bad = [
        _verdict(checkpoints["mxfp4"], p, v, g)
        for p, v, g in zip(prompts, theirs, ours, strict=True)
        if v != g
    ]
    assert not bad, "\n".join(bad)
    assert all(len(o) == N_NEW for o in ours)


def test_stop_tokens_end_both_engines_at_the_same_place(engine, gptoss_engine, loop):
    prompt = [4, 8, 15, 16, 23, 42]
    free = generate(
        loop, engine, [prompt], SamplingParams(max_new_tokens=N_NEW, temperature=0.0, ignore_eos=True)
    )[0]
    stops = (free[9], free[5])  # whichever comes first ends it, and is part of the output
    params = SamplingParams(max_new_tokens=N_NEW, temperature=0.0, stop_token_ids=stops)
    want = free[: min(free.index(s) for s in stops) + 1]
    assert generate(loop, engine, [prompt], params)[0] == want
    assert _gptoss(loop, gptoss_engine, [prompt], params)[0] == want

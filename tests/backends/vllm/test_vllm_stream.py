"""The Backend protocol on the session's real vLLM engine: exact tokens, streaming, stops, failures."""

from __future__ import annotations

import asyncio
import random

import pytest

from backends.base import BackendError
from harness.config import SamplingParams
from tests.backends.vllm.vllmkit import MAX_MODEL_LEN, collect, generate, greedy_reference

GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)


def _prompts(n: int, seed: int, lengths=(3, 300)) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(200_000) for _ in range(rng.randint(*lengths))] for _ in range(n)]


def test_greedy_tokens_equal_the_reference_model(engine, loop, checkpoints):
    # Prompts past 128 tokens exercise the sliding-window layers. The reference decodes the
    # MXFP4 checkpoint itself, vLLM the bf16-experts copy: the same weights.
    prompts = [[200006, 17360, 200008, 3575, 553], *_prompts(3, seed=11, lengths=(129, 300))]
    got = generate(loop, engine, prompts, GREEDY)
    assert got == greedy_reference(checkpoints["mxfp4"], prompts, GREEDY.max_new_tokens)


def test_deltas_stream_one_step_at_a_time(engine, loop):
    chunks = collect(
        loop, engine, [1, 2, 3, 4], SamplingParams(max_new_tokens=9, temperature=0.0, ignore_eos=True)
    )
    # DELTA output, stream_interval 1: one chunk per engine step, each holding that step's token.
    assert [len(c) for c in chunks] == [1] * 9
    assert all(isinstance(t, int) and 0 <= t < 201088 for c in chunks for t in c)


def test_final_only_yields_the_same_tokens_once(engine, loop):
    prompt = [5, 6, 7, 8, 9]
    streamed = [t for c in collect(loop, engine, prompt, GREEDY) for t in c]
    engine.final_only = True
    try:
        chunks = collect(loop, engine, prompt, GREEDY)
    finally:
        engine.final_only = False
    assert chunks == [streamed]


def test_stop_token_ends_the_output_and_is_included(engine, loop):
    prompt = [10, 20, 30]
    free = [t for c in collect(loop, engine, prompt, GREEDY) for t in c]
    stop = free[4]
    first = free.index(stop)  # the earliest occurrence is where it must stop
    stopped = SamplingParams(max_new_tokens=12, temperature=0.0, stop_token_ids=(stop,))
    assert [t for c in collect(loop, engine, prompt, stopped) for t in c] == free[: first + 1]
    # ignore_eos disables every stop id, the same rule as the gptoss engine and SGLang
    ignoring = SamplingParams(max_new_tokens=12, temperature=0.0, stop_token_ids=(stop,), ignore_eos=True)
    assert [t for c in collect(loop, engine, prompt, ignoring) for t in c] == free


def test_generation_config_eos_ids_do_not_stop_requests(engine, loop, checkpoints):
    # The checkpoint's generation_config.json lists 200002/199999/200012. With stop_token_ids=()
    # vLLM must not add them back; a long output of a random model would otherwise risk an
    # early stop. Here: no stop ids -> exactly max_new_tokens tokens, as with ignore_eos.
    p = SamplingParams(max_new_tokens=40, temperature=0.0, stop_token_ids=())
    out = [t for c in collect(loop, engine, [42] * 3, p) for t in c]
    assert len(out) == 40


def test_seeded_sampling_repeats_and_seeds_differ(engine, loop):
    prompt = list(range(100, 140))
    a = SamplingParams(max_new_tokens=16, temperature=1.0, seed=7, ignore_eos=True)
    b = SamplingParams(max_new_tokens=16, temperature=1.0, seed=8, ignore_eos=True)
    first, again, other = (
        generate(loop, engine, [prompt] * 3, a)[0],
        generate(loop, engine, [prompt], a)[0],
        generate(loop, engine, [prompt], b)[0],
    )
    assert first == again
    assert first != other


def test_concurrent_requests_match_one_at_a_time(engine, loop):
    prompts = _prompts(24, seed=5, lengths=(3, 200))
    together = generate(loop, engine, prompts, GREEDY)
    alone = [generate(loop, engine, [p], GREEDY)[0] for p in prompts[:4]]
    assert together[:4] == alone
    assert all(len(o) == GREEDY.max_new_tokens for o in together)


def test_leaving_early_aborts_the_request(engine, loop):
    long = SamplingParams(max_new_tokens=400, temperature=0.0, ignore_eos=True)

    async def take_three():
        got = []
        async for chunk in engine.stream([1, 1, 2, 3, 5, 8], long):
            got += chunk
            if len(got) >= 3:
                break
        return got

    async def cancel_one():
        task = asyncio.ensure_future(collect_all(engine.stream([13, 21, 34], long)))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    async def collect_all(agen):
        return [c async for c in agen]

    async def unfinished_after(coro):
        await coro
        for _ in range(600):  # the abort reaches the engine core within a few loop turns
            if engine._llm.output_processor.get_num_unfinished_requests() == 0:
                return 0
            await asyncio.sleep(0.05)
        return engine._llm.output_processor.get_num_unfinished_requests()

    assert loop.run(unfinished_after(take_three()), timeout=120) == 0
    assert loop.run(unfinished_after(cancel_one()), timeout=120) == 0
    # and the engine still serves
    assert len(generate(loop, engine, [[3, 4]], GREEDY)[0]) == GREEDY.max_new_tokens


@pytest.mark.parametrize(
    "prompt, message",
    [
        ([], "empty prompt"),
        ([1, 2, 201088], "prompt token id 201088 is outside the vocabulary [0, 201088)"),
        ([-1, 2], "prompt token id -1 is outside the vocabulary [0, 201088)"),
        (
            [7] * MAX_MODEL_LEN,
            f"prompt of {MAX_MODEL_LEN} tokens leaves no room to generate within "
            f"max_model_len={MAX_MODEL_LEN}",
        ),
    ],
)
def test_bad_prompts_fail_clearly_and_the_engine_lives_on(engine, loop, prompt, message):
    with pytest.raises(BackendError) as e:
        collect(loop, engine, prompt, GREEDY)
    assert str(e.value) == message
    assert len(generate(loop, engine, [[9, 9]], GREEDY)[0]) == GREEDY.max_new_tokens


def test_output_cut_by_max_model_len_is_a_failure_not_a_short_success(engine, loop):
    prompt = [11] * (MAX_MODEL_LEN - 3)
    got: list[int] = []

    async def go():
        async for chunk in engine.stream(prompt, GREEDY):
            got.extend(chunk)

    before = engine.truncated
    with pytest.raises(BackendError) as e:
        loop.run(go(), timeout=300)
    assert len(got) == 3  # the tokens that fit were streamed, none invented
    assert str(e.value) == (
        f"output cut at max_model_len={MAX_MODEL_LEN} after 3 of 12 tokens "
        f"(prompt {MAX_MODEL_LEN - 3}); raise --max-model-len"
    )
    assert engine.truncated == before + 1


def test_describe_records_versions_and_resolved_settings(engine):
    d = engine.describe()
    assert d["vllm_version"] == __import__("vllm").__version__
    assert d["engine_args"]["dtype"] == "float32" and d["engine_args"]["enforce_eager"] is True
    assert d["resolved"]["max_model_len"] == MAX_MODEL_LEN and d["resolved"]["max_num_seqs"] == 64


def test_max_concurrency_caps_requests_in_vllm(engine, loop):
    # --max-concurrency 2: at most two requests inside vLLM at any time; all still complete.
    long = SamplingParams(max_new_tokens=30, temperature=0.0, ignore_eos=True)
    seen: list[int] = []

    async def watch(done: asyncio.Event):
        while not done.is_set():
            seen.append(engine._llm.output_processor.get_num_unfinished_requests())
            await asyncio.sleep(0.005)

    async def go():
        engine._limit = asyncio.Semaphore(2)
        done = asyncio.Event()
        watcher = asyncio.ensure_future(watch(done))
        try:
            outs = await asyncio.gather(*(_drain(engine.stream([i + 1, 2, 3], long)) for i in range(6)))
        finally:
            engine._limit = None
            done.set()
            await watcher
        return outs

    assert loop.run(go(), timeout=300) == [30] * 6
    assert max(seen) == 2


async def _drain(agen) -> int:
    n = 0
    async for chunk in agen:
        n += len(chunk)
    return n

"""AsyncEngine on the tiny model: streaming, abort, early exit, errors reach every stream."""

from __future__ import annotations

import asyncio
import gc
import random

import pytest

from gptoss.async_engine import AsyncEngine
from gptoss.engine import Delta, EngineConfig, EngineError, LLMEngine
from gptoss.sampling import SamplingParams

LONG = SamplingParams(max_new_tokens=400, temperature=0.0, ignore_eos=True)


def prompt(n, seed=0):
    rng = random.Random(seed)
    return [rng.randrange(199000) for _ in range(n)]


def config(path, **kw):
    kw = {"dtype": "float32", "max_num_seqs": 8, "max_num_batched_tokens": 128, "kv_cache_tokens": 4096} | kw
    return EngineConfig(path, **kw)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


def blocks_all_free(engine: AsyncEngine) -> bool:
    bm = engine._core.scheduler.bm
    return (bm.full.num_free, bm.ring.num_free) == (bm.full.num_blocks, bm.ring.num_blocks)


async def collect(stream) -> list[Delta]:
    return [d async for d in stream]


def test_streams_equal_the_synchronous_engine(tiny_checkpoint):
    prompts = [prompt(n, seed=n) for n in (5, 150, 33)]
    params = [SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True) for n in (9, 4, 17)]
    expected = LLMEngine(config(tiny_checkpoint)).generate(prompts, params)

    async def main():
        async with AsyncEngine(config(tiny_checkpoint)) as engine:
            results = await asyncio.gather(
                *(collect(engine.generate(p, sp)) for p, sp in zip(prompts, params, strict=True))
            )
            assert blocks_all_free(engine)
            return results

    for deltas, want in zip(run(main()), expected, strict=True):
        assert [t for d in deltas for t in d.token_ids] == want
        assert all(d.token_ids for d in deltas) and all(d.finish_reason is None for d in deltas[:-1])
        assert (deltas[-1].finish_reason, deltas[-1].stop_token_id) == ("length", None)


def test_final_only_streams_yield_one_delta_with_every_token(tiny_checkpoint):
    prompts = [prompt(n, seed=n) for n in (5, 150, 33)]
    params = [SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True) for n in (9, 4, 17)]
    expected = LLMEngine(config(tiny_checkpoint)).generate(prompts, params)

    async def main():
        async with AsyncEngine(config(tiny_checkpoint)) as engine:
            return await asyncio.gather(
                *(
                    collect(engine.generate(p, sp, final_only=True))
                    for p, sp in zip(prompts, params, strict=True)
                )
            )

    for deltas, want in zip(run(main()), expected, strict=True):
        assert len(deltas) == 1  # woken once, at the end
        assert (deltas[0].token_ids, deltas[0].finish_reason) == (want, "length")


def test_abort_ends_the_stream_and_frees_its_blocks(tiny_checkpoint):
    async def main():
        async with AsyncEngine(config(tiny_checkpoint)) as engine:
            stream = engine.generate(prompt(40), LONG, request_id="victim")
            first = await anext(stream)
            engine.abort("victim")
            rest = await collect(stream)
            assert rest[-1].finish_reason == "abort"
            got = len(first.token_ids) + sum(len(d.token_ids) for d in rest)
            assert 1 <= got < LONG.max_new_tokens
            assert blocks_all_free(engine) and not engine._core.seqs

    run(main())


def test_leaving_early_or_cancelling_aborts_the_request(tiny_checkpoint):
    async def main():
        async with AsyncEngine(config(tiny_checkpoint)) as engine:
            async for _ in engine.generate(prompt(50), LONG):
                break  # the stream is dropped here: its finalizer aborts the request
            gc.collect()

            async def consume():
                async for _ in engine.generate(prompt(60), LONG):
                    started.set()

            started = asyncio.Event()
            task = asyncio.create_task(consume())
            await started.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # Aborts are handled before the next request is added, so once it is done both are gone.
            await collect(engine.generate(prompt(3), SamplingParams(max_new_tokens=2, temperature=0.0)))
            assert not engine._core.seqs and not engine._core.has_work() and blocks_all_free(engine)

    run(main())


def test_a_failed_step_fails_every_request_in_it_and_the_engine_goes_on(tiny_checkpoint):
    async def main():
        async with AsyncEngine(config(tiny_checkpoint)) as engine:
            runner = engine._core.runner
            real_run, calls = runner.run, []

            def faulty(batch):
                calls.append(len(batch.seqs))
                if len(calls) == 3:
                    raise RuntimeError("injected fault")
                return real_run(batch)

            runner.run = faulty
            streams = [engine.generate(prompt(20, seed=i), LONG) for i in range(3)]
            outcomes = await asyncio.gather(*(collect(s) for s in streams), return_exceptions=True)
            for err in outcomes:
                assert isinstance(err, EngineError)
                assert str(err) == "engine step failed: RuntimeError: injected fault"
                assert isinstance(err.__cause__, RuntimeError)
            assert blocks_all_free(engine)
            after = await collect(
                engine.generate(prompt(7), SamplingParams(max_new_tokens=3, temperature=0.0))
            )
            assert sum(len(d.token_ids) for d in after) == 3

    run(main())


def test_bad_requests_raise_at_generate_time(tiny_checkpoint):
    async def main():
        async with AsyncEngine(config(tiny_checkpoint, max_model_len=100)) as engine:
            assert engine.max_model_len == 100
            with pytest.raises(ValueError, match="prompt has 100 tokens but max_model_len is 100"):
                engine.generate([1] * 100, LONG)
            s = engine.generate([1, 2], LONG, request_id="dup")
            with pytest.raises(ValueError, match="request id 'dup' is already in flight"):
                engine.generate([1, 2], LONG, request_id="dup")
            s.close()

    run(main())
    with pytest.raises(RuntimeError, match="the engine is not running"):
        AsyncEngine(config(tiny_checkpoint)).generate([1], LONG)


def test_shutdown_fails_requests_still_in_flight(tiny_checkpoint):
    async def main():
        engine = AsyncEngine(config(tiny_checkpoint))
        async with engine:
            stream = engine.generate(
                prompt(30), SamplingParams(max_new_tokens=5000, temperature=0.0, ignore_eos=True)
            )
            await anext(stream)
        with pytest.raises(EngineError, match="shut down with this request in flight"):
            await collect(stream)
        assert not engine._thread.is_alive()

    run(main())

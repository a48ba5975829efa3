"""DPEngine on two CPU replicas of the tiny model: the tokens of one engine, least-loaded dispatch,
abort, a killed replica (named error, the other goes on), a failed start, and no process left behind."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from gptoss.async_engine import AsyncEngine
from gptoss.dp_engine import DPEngine, ReplicaDiedError, ReplicaStartError, open_engine
from gptoss.engine import Delta, EngineConfig, LLMEngine
from gptoss.sampling import SamplingParams
from tests.gptoss.dpkit import gone

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
LONG = SamplingParams(max_new_tokens=400, temperature=0.0, ignore_eos=True)


def config(path, **kw):
    kw = {"dtype": "float32", "max_num_seqs": 4, "kv_cache_tokens": 2048, "devices": ("cpu", "cpu")} | kw
    return EngineConfig(path, **kw)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 180))


async def collect(stream) -> list:
    return [d async for d in stream]


async def tokens(stream) -> list[int]:
    return [t async for d in stream for t in d.token_ids]


def test_two_replicas_stream_the_tokens_of_one_engine(tiny_checkpoint):
    prompts = [[(97 * i + 13 * j) % 199_000 for j in range(5 + 30 * i)] for i in range(6)]
    # Greedy ones and unseeded sampled ones: a sampled request's seed comes from its number, which
    # DPEngine counts across replicas as one engine counts its requests.
    params = [
        SamplingParams(max_new_tokens=n, temperature=0.0 if i % 3 else 1.0, ignore_eos=True)
        for i, n in enumerate((9, 4, 17, 6, 11, 3))
    ]
    assert isinstance(open_engine(config(tiny_checkpoint)), DPEngine)

    async def first_six(engine) -> list[list[Delta]]:
        streams = [
            engine.generate(p, sp, final_only=i % 2 == 0)
            for i, (p, sp) in enumerate(zip(prompts, params, strict=True))
        ]
        return await asyncio.gather(*(collect(s) for s in streams))

    async def one_engine():
        async with AsyncEngine(config(tiny_checkpoint, devices=("cpu",))) as engine:
            return [[t for d in ds for t in d.token_ids] for ds in await first_six(engine)]

    want = run(one_engine())

    async def main():
        async with open_engine(config(tiny_checkpoint)) as engine:
            # 2048 slots shared with the sliding layers' 128-token rings: the longest sequence is 1920
            assert (engine.num_replicas, engine.max_model_len, engine.vocab_size) == (2, 1920, 201088)
            deltas = await first_six(engine)
            assigned = [r.assigned for r in engine._replicas]

            # Abort after the first token, leave a second stream early: both replicas end idle.
            victim = engine.generate(prompts[0], LONG, request_id="victim")
            first = await anext(victim)
            engine.abort("victim")
            rest = [d async for d in victim]
            async for _ in engine.generate(prompts[1], LONG):
                break
            gc.collect()
            assert await tokens(engine.generate([5, 6], params[1])) == want_short
            while any(r.requests for r in engine._replicas):  # the early leaver's abort comes back
                await asyncio.sleep(0.02)
            loads = [(r.requests, r.tokens) for r in engine._replicas]
            with pytest.raises(ValueError, match="prompt has 1920 tokens but max_model_len is 1920"):
                engine.generate([1] * 1920, LONG)
            return deltas, assigned, first, rest, loads, engine.info(), engine.pids

    want_short = LLMEngine(config(tiny_checkpoint, devices=("cpu",))).generate([[5, 6]], params[1])[0]
    deltas, assigned, first, rest, loads, info, pids = run(main())
    for i, (ds, w) in enumerate(zip(deltas, want, strict=True)):
        assert [t for d in ds for t in d.token_ids] == w
        assert ds[-1].finish_reason == "length"
        assert len(ds) == 1 if i % 2 == 0 else all(d.token_ids for d in ds)  # final_only: one wake-up
    assert assigned == [3, 3]  # least loaded first: the prompts' token costs alternate
    assert rest[-1].finish_reason == "abort"
    assert len(first.token_ids) + sum(len(d.token_ids) for d in rest) < LONG.max_new_tokens
    assert loads == [(0, 0), (0, 0)]
    assert info["device"] == "cpu,cpu" and info["data_parallel_size"] == 2
    assert [r["pid"] for r in info["replicas"]] == pids and info["replicas"][1]["kv_cache_tokens"] == 2048
    assert info["replicas"][1]["kv_max_seqs"] == 1  # 1920 tokens: 120 full + 8 ring blocks of 128
    assert gone(pids, within=0.0)  # __aexit__ joined them


def test_a_killed_replica_fails_its_requests_by_name_and_the_other_goes_on(tiny_checkpoint):
    want = LLMEngine(config(tiny_checkpoint, devices=("cpu",))).generate([[1, 2, 3], [7, 8]], LONG)

    async def main():
        async with open_engine(config(tiny_checkpoint)) as engine:
            streams = [engine.generate(p, LONG) for p in ([1, 2, 3], [4, 5, 6], [7, 8], [9, 10])]
            await anext(streams[1])  # replica 1 is decoding
            os.kill(engine.pids[1], signal.SIGKILL)
            outcomes = await asyncio.gather(*(tokens(s) for s in streams), return_exceptions=True)
            after = await tokens(engine.generate([1, 2, 3], LONG))  # only replica 0 is left
            os.kill(engine.pids[0], signal.SIGKILL)
            while engine._replicas[0].alive:
                await asyncio.sleep(0.05)
            with pytest.raises(ReplicaDiedError, match="every replica died; the first: replica 1 on cpu"):
                engine.generate([1], LONG)
            return outcomes, after, engine.pids

    outcomes, after, pids = run(main())
    assert outcomes[0] == want[0] and outcomes[2] == want[1] and after == want[0]
    for err in (outcomes[1], outcomes[3]):
        assert isinstance(err, ReplicaDiedError)
        assert str(err) == f"replica 1 on cpu (pid {pids[1]}) died: killed by SIGKILL (exit code -9)"
    assert gone(pids, within=0.0)


def test_a_replica_that_cannot_start_is_one_error_and_leaves_no_process(tiny_checkpoint):
    engine = open_engine(config(tiny_checkpoint, kv_cache_tokens=256, max_model_len=1024))

    async def main():
        async with engine:
            pass

    with pytest.raises(ReplicaStartError) as err:
        run(main())
    assert err.match(
        r"^replica [01] on cpu \(pid \d+\) failed to start: ValueError: the KV cache holds 128 tokens"
        r" \(256 slots, with a sequence's last 128 for the sliding layers\), "
        r"fewer than max_model_len 1024: raise --kv-cache-tokens or lower --max-model-len"
        r"( \(1 other replica\(s\) failed too\))?$"
    )
    assert len(engine.pids) == 2 and gone(engine.pids, within=0.0)


PARENT = """
import asyncio, sys
from pathlib import Path
from gptoss.dp_engine import open_engine
from gptoss.engine import EngineConfig

async def main():
    config = EngineConfig(Path(sys.argv[1]), dtype="float32", kv_cache_tokens=1024, devices=("cpu", "cpu"))
    async with open_engine(config) as engine:
        print(*engine.pids, flush=True)
        await asyncio.sleep(600)

if __name__ == "__main__":
    asyncio.run(main())
"""


def test_replicas_die_with_a_parent_killed_by_sigkill(tiny_checkpoint, tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tiny_checkpoint)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids)
        proc.kill()  # no atexit, no __aexit__: PR_SET_PDEATHSIG and the pipe's EOF are all that is left
        proc.wait(10)
        assert gone(pids), "a replica outlived its parent"
    finally:
        proc.kill()
        proc.wait(10)

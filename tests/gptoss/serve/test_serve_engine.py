"""python -m gptoss.serve as a real process on the tiny checkpoint, driven by our clients and by the
MLCommons reference client's exact requests. Greedy tokens must equal the in-process engine's.

Requests run one at a time where tokens are compared, so batching cannot change an argmax.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import aiohttp
import orjson
import pytest

from backends.http import ServerReportedError
from harness.config import SamplingParams
from tests.backends.httpkit import PROMPTS, collect, make_backend, start_process, stop_process

pytestmark = pytest.mark.timeout(300)

MAX_NEW = 12
GREEDY = SamplingParams(max_new_tokens=MAX_NEW, temperature=0.0)


async def _one_at_a_time(name: str, url: str, **opts) -> list[list[int]]:
    async with make_backend(name, [url], ready_timeout_s=60, **opts) as backend:
        out = []
        for prompt in PROMPTS:
            got, err = await collect(backend, prompt, GREEDY)
            assert err is None, repr(err)
            out.append(got)
        return out


@pytest.mark.parametrize("name", ["sglang", "openai"])
@pytest.mark.parametrize("stream", [True, False])
def test_clients_get_the_engines_greedy_tokens(name, stream, gptoss_server, oracle):
    assert asyncio.run(_one_at_a_time(name, gptoss_server, stream=stream)) == [
        oracle[tuple(p)] for p in PROMPTS
    ]


def test_stream_interval_changes_chunking_not_tokens(gptoss_server, oracle):
    got = asyncio.run(_one_at_a_time("sglang", gptoss_server, stream_interval=5))
    assert got == [oracle[tuple(p)] for p in PROMPTS]


def test_reference_client_requests_and_the_fields_it_reads(gptoss_server, oracle):
    """The MLCommons gpt-oss SGLang client's two requests, byte for byte in shape."""
    import requests

    # initialize(): a blocking, non-streamed probe
    r = requests.post(
        f"{gptoss_server}/generate",
        json={
            "input_ids": [1, 2, 3],
            "sampling_params": {"max_new_tokens": 5, "temperature": 0.001, "top_k": 1, "top_p": 1.0},
        },
        timeout=60,
    )
    assert r.status_code == 200
    probe = r.json()
    assert "error" not in probe
    assert len(probe["output_ids"]) == probe["meta_info"]["completion_tokens"] <= 5
    assert probe["meta_info"]["finish_reason"]["type"] in ("length", "stop")
    assert set(probe["meta_info"]) >= {
        "id",
        "prompt_tokens",
        "completion_tokens",
        "cached_tokens",
        "e2e_latency",
    }

    # generate_stream(): SSE, read line by line as the reference does
    async def stream(prompt):
        payload = {
            "input_ids": prompt,
            "sampling_params": {"max_new_tokens": MAX_NEW, "temperature": 0.001, "top_k": 1, "top_p": 1.0},
            "stream": True,
        }
        chunks = []
        async with aiohttp.ClientSession() as s, s.post(f"{gptoss_server}/generate", json=payload) as resp:
            assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
            async for line in resp.content:
                line = line.decode().strip()
                if line:
                    assert line.startswith("data: ")
                    chunks.append(line[6:])
        return chunks

    for prompt in PROMPTS:
        want = oracle[tuple(prompt)]
        chunks = asyncio.run(stream(prompt))
        assert chunks[-1] == "[DONE]"
        events = [orjson.loads(c) for c in chunks[:-1]]
        counts = [ev["meta_info"]["completion_tokens"] for ev in events]
        assert counts == sorted(set(counts)) and counts[0] >= 1  # a chunk per step (steps that queued merge)
        for k, ev in enumerate(events):
            meta = ev["meta_info"]
            assert ev["output_ids"] == want[: meta["completion_tokens"]]  # cumulative by default
            assert meta["prompt_tokens"] == len(prompt)
            assert (meta["finish_reason"] is None) == (k < len(events) - 1)
        last = events[-1]["meta_info"]
        assert last["completion_tokens"] == len(want)
        reason = last["finish_reason"]
        if len(want) < MAX_NEW:
            assert reason == {"type": "stop", "matched": want[-1]} and want[-1] in GREEDY.stop_token_ids
        else:
            assert reason == {"type": "length", "length": MAX_NEW}


def test_health_models_and_openai_usage(gptoss_server, tiny_checkpoint):
    async def main():
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{gptoss_server}/health") as r:
                assert r.status == 200
            async with s.get(f"{gptoss_server}/v1/models") as r:
                models = await r.json()
            body = {
                "prompt": PROMPTS[0],
                "max_tokens": 4,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
                "return_token_ids": True,
                "stream_options": {"include_usage": True},
            }
            async with s.post(f"{gptoss_server}/v1/completions", json=body) as r:
                text = await r.text()
        return models, [x for x in text.split("\n\n") if x]

    models, lines = asyncio.run(main())
    assert [m["id"] for m in models["data"]] == [tiny_checkpoint.name]
    assert lines[-1] == "data: [DONE]"
    events = [orjson.loads(x[6:]) for x in lines[:-1]]
    assert events[0]["choices"][0]["prompt_token_ids"] == PROMPTS[0]
    assert sum(len(e["choices"][0]["token_ids"]) for e in events[:-1]) == 4
    assert events[-1]["choices"] == [] and events[-1]["usage"] == {
        "prompt_tokens": len(PROMPTS[0]),
        "completion_tokens": 4,
        "total_tokens": len(PROMPTS[0]) + 4,
    }


def test_default_checkpoint_is_served_without_model_path(tmp_path):
    """No --model-path: gptoss.default's tiny checkpoint, made once under $MLPERF_DATA_DIR."""
    from gptoss import default

    env = {"MLPERF_DATA_DIR": str(tmp_path / "data")}
    proc, line = start_process(
        [sys.executable, "-m", "gptoss.serve", "--port", "0"],
        "gptoss.serve: listening on ",
        timeout=240,
        env=env,
    )
    try:
        os.environ["MLPERF_DATA_DIR"], saved = env["MLPERF_DATA_DIR"], os.environ.get("MLPERF_DATA_DIR")
        try:
            ckpt = default.default_checkpoint()
        finally:
            os.environ.pop("MLPERF_DATA_DIR") if saved is None else os.environ.update(MLPERF_DATA_DIR=saved)
        assert f"(model {ckpt.name}," in line and ckpt.is_relative_to(tmp_path / "data")
        got = asyncio.run(_one_at_a_time("sglang", line.split()[0]))
        assert len(got) == len(PROMPTS) and all(got)
    finally:
        stop_process(proc)


def test_incremental_output_gives_the_same_tokens(tiny_checkpoint, oracle):
    proc, line = start_process(
        [
            sys.executable,
            "-m",
            "gptoss.serve",
            "--model-path",
            str(tiny_checkpoint),
            "--port",
            "0",
            "--dtype",
            "float32",
            "--incremental-streaming-output",
        ],
        "gptoss.serve: listening on ",
        timeout=240,
    )
    try:
        got = asyncio.run(_one_at_a_time("sglang", line.split()[0]))
        assert got == [oracle[tuple(p)] for p in PROMPTS]
    finally:
        stop_process(proc)


async def _sse_events(session: aiohttp.ClientSession, url: str, body: dict, events: list) -> None:
    """Every `data:` payload of one stream, in order, into `events` (as it arrives)."""
    async with session.post(url, json=body) as r:
        assert r.status == 200
        async for raw in r.content:
            if raw.startswith(b"data: "):
                payload = raw[6:].strip()
                events.append("[DONE]" if payload == b"[DONE]" else orjson.loads(payload))


def test_sigterm_drains_within_the_timeout_then_ends_cut_streams_with_an_abort_event(tiny_checkpoint):
    """SIGTERM: new requests 503; a short request finishes; long ones run until --shutdown-timeout, then
    each stream ends with an abort event and [DONE]; the process exits 0 within the timeout + a margin
    (it used to take twice the timeout and cut streams with neither)."""
    timeout = 6.0
    proc, line = start_process(
        [
            sys.executable,
            "-m",
            "gptoss.serve",
            "--model-path",
            str(tiny_checkpoint),
            "--port",
            "0",
            "--dtype",
            "float32",
            "--shutdown-timeout",
            str(timeout),
        ],
        "gptoss.serve: listening on ",
        timeout=240,
    )
    url = line.split()[0]
    most = int(line.rstrip(")").split()[-1]) - 3  # as long as the context allows: it runs until cut
    try:

        async def main():
            gen_events, cmpl_events = [], []
            long = {"max_new_tokens": most, "ignore_eos": True}
            async with aiohttp.ClientSession() as s:
                tasks = [
                    asyncio.create_task(
                        _sse_events(
                            s,
                            url + "/generate",
                            {"input_ids": [5, 6, 7], "sampling_params": long, "stream": True},
                            gen_events,
                        )
                    ),
                    asyncio.create_task(
                        _sse_events(
                            s,
                            url + "/v1/completions",
                            {
                                "prompt": [5, 6, 7],
                                "max_tokens": most,
                                "ignore_eos": True,
                                "stream": True,
                                "return_token_ids": True,
                            },
                            cmpl_events,
                        )
                    ),
                ]
                while len(gen_events) < 3 or len(cmpl_events) < 3:  # both streams are running
                    await asyncio.sleep(0.05)
                proc.send_signal(signal.SIGTERM)
                t_term = time.monotonic()
                await asyncio.sleep(0.5)
                async with s.get(url + "/health") as r:
                    health = r.status
                async with s.post(url + "/generate", json={"input_ids": [1], "stream": False}) as r:
                    refused = r.status, (await r.json())["error"]["message"]
                await asyncio.gather(*tasks)
                cut_after = time.monotonic() - t_term
            rc = await asyncio.to_thread(proc.wait, 60)
            return gen_events, cmpl_events, health, refused, cut_after, time.monotonic() - t_term, rc

        gen_events, cmpl_events, health, refused, cut_after, exited_after, rc = asyncio.run(main())
        assert health == 503 and refused == (503, "the server is shutting down")
        assert timeout <= cut_after and exited_after < timeout + 4, (cut_after, exited_after)
        assert rc == 0 and "gptoss.serve: stopped" in proc.stdout.read()

        assert gen_events[-1] == "[DONE]" and "[DONE]" not in gen_events[:-1]
        last = gen_events[-2]["meta_info"]
        assert last["finish_reason"]["type"] == "abort" and "shut down" in last["finish_reason"]["message"]
        assert all(e["meta_info"]["finish_reason"] is None for e in gen_events[:-2])
        assert 0 < last["completion_tokens"] == len(gen_events[-2]["output_ids"]) < most

        assert cmpl_events[-1] == "[DONE]" and "[DONE]" not in cmpl_events[:-1]
        choice = cmpl_events[-2]["choices"][0]
        assert choice["finish_reason"] == "abort" and "shut down" in choice["stop_reason"]
        assert all(e["choices"][0]["finish_reason"] is None for e in cmpl_events[:-2])
    finally:
        stop_process(proc)


def test_our_clients_count_a_cut_stream_as_the_servers_abort(tiny_checkpoint):
    proc, line = start_process(
        [
            sys.executable,
            "-m",
            "gptoss.serve",
            "--model-path",
            str(tiny_checkpoint),
            "--port",
            "0",
            "--dtype",
            "float32",
            "--shutdown-timeout",
            "1",
        ],
        "gptoss.serve: listening on ",
        timeout=240,
    )
    url = line.split()[0]
    most = int(line.rstrip(")").split()[-1]) - 3
    try:

        async def main():
            async with make_backend("sglang", [url], ready_timeout_s=60) as b:
                task = asyncio.create_task(
                    collect(b, [5, 6, 7], SamplingParams(max_new_tokens=most, ignore_eos=True))
                )
                await asyncio.sleep(1.0)
                proc.send_signal(signal.SIGTERM)
                return await task

        got, err = asyncio.run(main())
        assert proc.wait(timeout=60) == 0
        assert isinstance(err, ServerReportedError) and "the server shut down" in str(err)
        assert 0 < len(got) < most and all(type(x) is int for x in got)  # real tokens only
    finally:
        stop_process(proc)

"""gptoss.serve's HTTP layer under faults of the engine behind it and abuse from clients.

The server runs in-process on 127.0.0.1 in front of a scripted engine (a fake, only to inject
engine failures and slowness); the clients are our real backends and raw aiohttp.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from backends.http import ServerHTTPError, ServerReportedError
from gptoss.serve.app import Server, build_app
from gptoss.serve.main import parse_args
from harness.config import SamplingParams
from tests.backends.httpkit import collect, make_backend

pytestmark = pytest.mark.timeout(60)


@dataclass
class Delta:
    token_ids: list[int]
    finish_reason: str | None
    stop_token_id: int | None = None


class ScriptedEngine:
    """Yields 500 + i; fails after `fail_after` tokens; waits `delay` s per token; records aborts."""

    max_model_len = 64

    def __init__(self, fail_after: int | None = None, delay: float = 0.0) -> None:
        self.fail_after = fail_after
        self.delay = delay
        self.closed_early: list[str] = []

    def adapters(self):
        return {}

    async def generate(self, prompt, params, request_id=None, lora=None):
        n = params.max_new_tokens
        done = False
        try:
            for i in range(n):
                if self.fail_after is not None and i == self.fail_after:
                    raise RuntimeError("CUDA error: an illegal memory access was encountered")
                await asyncio.sleep(self.delay)
                done = i == n - 1
                yield Delta([500 + i], "length" if done else None)
        finally:
            if not done:
                self.closed_early.append(request_id)


async def start(engine, *flags: str):
    args = parse_args(["--port", "0", *flags])
    runner = aiohttp.web.AppRunner(
        build_app(Server(engine, args, Path("/ckpt/tiny"), 1000)), handler_cancellation=True
    )
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


P4 = SamplingParams(max_new_tokens=4)


@pytest.mark.parametrize("name", ["sglang", "openai"])
def test_engine_failure_mid_stream_reaches_the_client_with_its_message(name):
    async def main():
        runner, url = await start(ScriptedEngine(fail_after=2))
        try:
            async with make_backend(name, [url]) as b:
                return await collect(b, [1, 2], P4)
        finally:
            await runner.cleanup()

    got, err = asyncio.run(main())
    assert isinstance(err, ServerReportedError), repr(err)
    assert "engine error: RuntimeError: CUDA error: an illegal memory access was encountered" in str(err)
    assert got == [500, 501]


@pytest.mark.parametrize("name", ["sglang", "openai"])
def test_engine_failure_without_streaming_is_http_500(name):
    async def main():
        runner, url = await start(ScriptedEngine(fail_after=2))
        try:
            async with make_backend(name, [url], stream=False) as b:
                return await collect(b, [1, 2], P4)
        finally:
            await runner.cleanup()

    got, err = asyncio.run(main())
    assert isinstance(err, ServerHTTPError) and err.status == 500 and "illegal memory access" in str(err)
    assert got == []


def test_client_going_away_aborts_the_request_in_the_engine():
    engine = ScriptedEngine(delay=0.05)

    async def main():
        runner, url = await start(engine)
        try:
            async with aiohttp.ClientSession() as s:
                body = {
                    "input_ids": [1, 2],
                    "sampling_params": {"max_new_tokens": 50},
                    "stream": True,
                    "rid": "gone",
                }
                async with s.post(url + "/generate", json=body) as r:
                    await r.content.readline()  # the first chunk arrived: the request is running
            for _ in range(1000):  # the disconnect reaches the handler asynchronously
                if engine.closed_early:
                    break
                await asyncio.sleep(0.02)
        finally:
            await runner.cleanup()

    asyncio.run(main())
    assert engine.closed_early == ["gone"]


def test_requests_beyond_the_queue_bound_get_503():
    async def main():
        runner, url = await start(
            ScriptedEngine(delay=0.05), "--max-num-seqs", "1", "--max-queued-requests", "1"
        )
        try:
            async with make_backend("sglang", [url], max_concurrency=8) as b:
                # 40 tokens x 0.05 s: the third request arrives long before the first one ends.
                return await asyncio.gather(
                    *(collect(b, [1], SamplingParams(max_new_tokens=40)) for _ in range(3))
                )
        finally:
            await runner.cleanup()

    results = asyncio.run(main())
    ok = [got for got, err in results if err is None]
    busy = [err for got, err in results if err is not None]
    assert ok == [list(range(500, 540))] * 2
    assert len(busy) == 1 and isinstance(busy[0], ServerHTTPError) and busy[0].status == 503
    assert "the server is busy: 2 requests in flight" in str(busy[0])


def test_oversized_body_and_bad_json_get_4xx_with_the_error_shape():
    async def main():
        runner, url = await start(ScriptedEngine(), "--max-request-bytes", "2000")
        try:
            async with aiohttp.ClientSession() as s:
                out = []
                for data in (b'{"input_ids": [' + b"1," * 2000 + b"1]}", b"{not json"):
                    async with s.post(
                        url + "/generate", data=data, headers={"Content-Type": "application/json"}
                    ) as r:
                        out.append((r.status, await r.json()))
                return out
        finally:
            await runner.cleanup()

    (s1, big), (s2, bad) = asyncio.run(main())
    assert s1 == 413 and "request body too large" in big["error"]["message"]
    assert s2 == 400 and big["error"]["code"] == 413 and "not valid JSON" in bad["error"]["message"]


@pytest.mark.parametrize(
    "body, message",
    [
        (
            {"input_ids": [1], "sampling_params": {"max_new_tokens": 4, "temprature": 0}},
            "unknown sampling parameter(s): temprature",
        ),
        (
            {"input_ids": [1], "sampling_params": {"frequency_penalty": 0.5}},
            "sampling parameter 'frequency_penalty'=0.5 is not supported by this server",
        ),
        (
            {"input_ids": [1], "sampling_params": {"top_k": 0}},
            "top_k must be -1 (disable), or at least 1, got 0",
        ),
        ({"input_ids": [1, 1000]}, "input_ids holds token id 1000, outside the vocabulary [0, 1000)"),
        ({"input_ids": []}, "the prompt is empty"),
        (
            {"input_ids": [1] * 60, "sampling_params": {"max_new_tokens": 5}},
            "maximum context length of 64 tokens: 60 prompt tokens + 5 new tokens = 65",
        ),
        ({"input_ids": [[1], [2]]}, "batched input_ids (a list of lists) are not supported"),
        ({"text": "hi"}, "this server takes token ids"),
        ({"input_ids": [1], "lora_path": "x"}, "lora_path 'x' is not a loaded LoRA adapter (loaded: none)"),
        (
            {"input_ids": [1], "sampling_params": {"max_new_tokens": True}},
            "max_new_tokens must be an integer",
        ),
    ],
)
def test_bad_generate_requests_get_400_with_sglangs_error_shape(body, message):
    async def main():
        runner, url = await start(ScriptedEngine())
        try:
            async with aiohttp.ClientSession() as s, s.post(url + "/generate", json=body) as r:
                return r.status, await r.json()
        finally:
            await runner.cleanup()

    status, reply = asyncio.run(main())
    assert status == 400 and set(reply) == {"error"}
    assert message in reply["error"]["message"] and reply["error"]["code"] == 400

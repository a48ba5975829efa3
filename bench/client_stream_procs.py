"""The processes bench/client_stream.py starts: the SGLang-shaped server and the clients it measures."""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path

PROMPT = list(range(100, 200))


# ----------------------------------------------------------------------------- server


def encode_events(n: int, incremental: bool, interval: int) -> list[bytes]:
    """The SSE chunks SGLang writes for an n-token answer (orjson, meta_info last)."""
    import orjson

    rng = random.Random(n)
    ids = [rng.randrange(0, 201088) for _ in range(n)]
    events = []
    for start in range(0, n, interval):
        upto = min(start + interval, n)
        done = upto == n
        meta = {
            "id": "bench",
            "finish_reason": {"type": "length", "length": n} if done else None,
            "prompt_tokens": len(PROMPT),
            "completion_tokens": upto,
            "cached_tokens": 0,
        }
        if done:
            meta["e2e_latency"] = 0.0
        out = ids[start:upto] if incremental else ids[:upto]
        events.append(b"data: " + orjson.dumps({"output_ids": out, "meta_info": meta}) + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return events


def serve(port: int, paced_interval_ms: float, stream_interval: int) -> None:
    import orjson
    import uvloop
    from aiohttp import web

    cache: dict[tuple[int, bool], tuple[list[bytes], bytes]] = {}
    dt = paced_interval_ms / 1000

    def events(n: int, incremental: bool) -> tuple[list[bytes], bytes]:
        key = (n, incremental)
        if key not in cache:
            ev = encode_events(n, incremental, stream_interval)
            cache[key] = (ev, b"".join(ev))
        return cache[key]

    async def generate(request: web.Request) -> web.StreamResponse:
        phase, mode = request.match_info["route"].split("-")
        body = orjson.loads(await request.read())
        n = body["sampling_params"]["max_new_tokens"]
        if not body.get("stream"):  # the reference client's initialize() probe
            ids = list(range(n))
            return web.Response(
                body=orjson.dumps(
                    {
                        "output_ids": ids,
                        "meta_info": {
                            "id": "probe",
                            "finish_reason": {"type": "length", "length": n},
                            "prompt_tokens": 3,
                            "completion_tokens": n,
                            "cached_tokens": 0,
                            "e2e_latency": 0.0,
                        },
                    }
                ),
                content_type="application/json",
            )
        ev, whole = events(n, mode == "incremental")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if phase == "burst":
            await resp.write(whole)
        else:
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            for k, chunk in enumerate(ev):
                wait = t0 + k * dt - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                await resp.write(chunk)
        return resp

    async def health(request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/{route}/generate", generate)
        app.router.add_get("/{route}/health", health)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", port, backlog=4096)
        await site.start()
        print(f"PORT {site._server.sockets[0].getsockname()[1]}", flush=True)
        await asyncio.Event().wait()

    uvloop.run(main())


# ----------------------------------------------------------------------------- clients


def ours(url: str, concurrency: int):
    from backends.sglang import SglangOptions, create
    from harness.config import RunConfig, SamplingParams

    cfg = RunConfig(
        backend="sglang",
        scenario="offline",
        input_file=None,
        output_dir=Path("unused"),
        sampling=SamplingParams(max_new_tokens=1),
        server_urls=(url,),
        max_concurrency=concurrency,
        backend_options=SglangOptions(),
    )
    backend = create(cfg)

    async def stream(n: int):
        params = SamplingParams(max_new_tokens=n)
        async for ids in backend.stream(PROMPT, params):
            yield len(ids)

    return backend, stream


def raw(url: str, concurrency: int):
    """Not a client: reads the bytes with aiohttp and parses nothing. The floor of any aiohttp client."""
    import aiohttp
    import orjson

    state = {}

    class _Ctx:
        async def __aenter__(self):
            state["s"] = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=concurrency), read_bufsize=1 << 20
            )

        async def __aexit__(self, *exc):
            await state["s"].close()

    async def stream(n: int):
        body = orjson.dumps({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": n}, "stream": True})
        async with state["s"].post(
            url + "/generate", data=body, headers={"Content-Type": "application/json"}
        ) as r:
            while await r.content.readany():
                pass
        yield n  # counted, not parsed

    return _Ctx(), stream


def reference(url: str, checkout: Path):
    import importlib.util

    pkg = checkout / "language" / "gpt-oss-120b" / "backends"
    spec = importlib.util.spec_from_file_location(
        "mlc_reference_backends", pkg / "__init__.py", submodule_search_locations=[str(pkg)]
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules["mlc_reference_backends"] = mod
    spec.loader.exec_module(mod)
    backend = mod.SGLangBackend(server_url=url, timeout=1200)

    class _Ctx:  # the reference is set up synchronously (requests-based initialize())
        async def __aenter__(self):
            backend.initialize()
            return self

        async def __aexit__(self, *exc):
            backend.cleanup()

    async def stream(n: int):
        async for chunk in backend.generate_stream(
            input_ids=PROMPT, max_tokens=n, temperature=1.0, top_k=-1, top_p=1.0
        ):
            if chunk.get("error"):
                raise RuntimeError(chunk["error"])
            if chunk["delta_token_ids"]:
                yield len(chunk["delta_token_ids"])
            if chunk["is_finished"]:
                break

    return _Ctx(), stream


async def run_client(args: argparse.Namespace) -> dict:
    url = f"{args.url}/{args.phase}-{args.mode}"
    if args.impl == "reference":
        ctx, stream = reference(url, Path(args.checkout))
    else:
        ctx, stream = (ours if args.impl == "ours" else raw)(url, args.concurrency)
    n = args.tokens
    dt = args.paced_interval_ms / 1000
    lateness: list[float] = []
    totals = {"tokens": 0, "requests": 0, "bad": 0}

    async def worker(deadline: float) -> None:
        while time.monotonic() < deadline:
            sent = time.monotonic()
            got = 0
            async for k in stream(n):
                if args.phase == "paced":
                    now = time.monotonic()
                    # Token j was scheduled at sent + j*dt; chunk k carries tokens got .. got+k-1.
                    lateness.extend(now - sent - j * dt for j in range(got, got + k))
                got += k
            totals["tokens"] += got
            totals["requests"] += 1
            totals["bad"] += got != n

    async with ctx:
        cpu0, t0 = time.process_time(), time.monotonic()
        await asyncio.gather(*(worker(t0 + args.seconds) for _ in range(args.concurrency)))
        wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
    out = {**totals, "tokens_per_s": totals["tokens"] / wall, "cpu_util": cpu / wall}
    if lateness:
        lateness.sort()
        out["p50_ms"] = 1000 * lateness[len(lateness) // 2]
        out["p99_ms"] = 1000 * lateness[int(len(lateness) * 0.99)]
    return out

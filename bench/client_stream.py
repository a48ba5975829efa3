"""How fast the sglang client takes streamed tokens, and the latency it adds (ours vs MLCommons reference).

A local SGLang-shaped server (uvloop, chunks pre-encoded once) runs on one core and each client on
another (taskset). Two phases per client and output mode:
  burst: every response is written at once; tokens/s the client processes on its one core;
  paced: each stream gets one chunk per --paced-interval-ms; per-token lateness = arrival time minus
         the time the server scheduled that token (from the request's send time): the added latency.
With --reference-checkout PATH (a checkout of github.com/mlcommons/inference) the reference's
language/gpt-oss-120b/backends/sglang_backend.py runs against the same server in the same run.

    python bench/client_stream.py [--reference-checkout /tmp/mlcommons-inference]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
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


# ----------------------------------------------------------------------------- driver


def client_cmd(args: argparse.Namespace, url: str, impl: str, phase: str, mode: str) -> list[str]:
    burst = phase == "burst"
    return [
        "taskset",
        "-c",
        str(args.client_core),
        sys.executable,
        __file__,
        "--role",
        "client",
        "--impl",
        impl,
        "--url",
        url,
        "--phase",
        phase,
        "--mode",
        mode,
        "--tokens",
        str(args.tokens if burst else args.paced_tokens),
        "--concurrency",
        str(args.concurrency if burst else args.paced_streams),
        "--seconds",
        str(args.seconds if burst else args.paced_seconds),
        "--paced-interval-ms",
        str(args.paced_interval_ms),
        "--checkout",
        str(args.reference_checkout or ""),
    ]


def drive(args: argparse.Namespace) -> None:
    server = subprocess.Popen(
        [
            "taskset",
            "-c",
            str(args.server_core),
            sys.executable,
            __file__,
            "--role",
            "server",
            "--paced-interval-ms",
            str(args.paced_interval_ms),
            "--stream-interval",
            str(args.stream_interval),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        line = server.stdout.readline()
        if not line.startswith("PORT "):
            raise SystemExit(f"bench server did not start: {line!r}")
        url = f"http://127.0.0.1:{line.split()[1]}"
        impls = ["raw", "ours"] + (["reference"] if args.reference_checkout else [])
        rows = []
        for mode in args.modes.split(","):
            for impl in impls:
                res = {}
                for phase in ("burst", "paced") if impl != "raw" else ("burst",):
                    proc = subprocess.run(
                        client_cmd(args, url, impl, phase, mode),
                        capture_output=True,
                        text=True,
                        cwd=ROOT,
                        env={**os.environ, "PYTHONPATH": str(ROOT)},
                    )
                    if proc.returncode:
                        raise SystemExit(f"{impl} {phase} {mode} failed:\n{proc.stderr[-3000:]}")
                    res[phase] = json.loads(proc.stdout.strip().splitlines()[-1])
                rows.append((mode, impl, res))
                print(f"  done: {impl} {mode}: {res}", file=sys.stderr, flush=True)
    finally:
        server.kill()
        server.wait()
    report(args, rows)


def report(args: argparse.Namespace, rows: list) -> None:
    print(
        f"\nsglang client streaming, {args.tokens} tokens/request, stream_interval {args.stream_interval}, "
        f"client on core {args.client_core}, server on core {args.server_core}"
    )
    print(
        f"paced: {args.paced_streams} streams x 1 chunk/{args.paced_interval_ms:g} ms, "
        f"{args.paced_tokens} tokens/request\n"
    )
    # tokens per client CPU-second = what one fully used core sustains; it is robust to other load on
    # the machine, unlike wall tokens/s, which is also shown (with the share of a core the client got).
    print(
        "| output ids | client | tokens / client CPU-s | wall tokens/s | client CPU | bad requests "
        "| paced p50 added | paced p99 added |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    by = {}
    names = {
        "raw": "aiohttp read, no parsing (floor)",
        "ours": "ours (backends/sglang.py)",
        "reference": "MLCommons reference",
    }
    for mode, impl, res in rows:
        b, p = res["burst"], res.get("paced")
        per_cpu = b["tokens_per_s"] / b["cpu_util"]
        by[(mode, impl)] = per_cpu
        paced = f"{p['p50_ms']:.2f} ms | {p['p99_ms']:.2f} ms" if p else "- | -"
        bad = b["bad"] + (p["bad"] if p else 0)
        print(
            f"| {mode} | {names[impl]} | {per_cpu:,.0f} | {b['tokens_per_s']:,.0f} |"
            f" {100 * b['cpu_util']:.0f}% | "
            f"{bad} | {paced} |"
        )
    for mode in args.modes.split(","):
        if (mode, "reference") in by:
            print(
                f"\n{mode}: ours / reference = {by[(mode, 'ours')] / by[(mode, 'reference')]:.1f}x "
                "tokens per client CPU-second"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reference-checkout", type=Path, help="checkout of the mlcommons/inference repo")
    ap.add_argument("--tokens", type=int, default=1024, help="tokens per request, burst phase (default 1024)")
    ap.add_argument("--concurrency", type=int, default=64, help="streams at once, burst phase (default 64)")
    ap.add_argument("--seconds", type=float, default=8.0, help="burst phase length per client (default 8)")
    ap.add_argument("--paced-streams", type=int, default=32)
    ap.add_argument("--paced-interval-ms", type=float, default=2.0)
    ap.add_argument("--paced-tokens", type=int, default=256)
    ap.add_argument("--paced-seconds", type=float, default=5.0)
    ap.add_argument("--stream-interval", type=int, default=1, help="tokens per chunk (SGLang default 1)")
    ap.add_argument("--modes", default="cumulative,incremental", help="output_ids modes to run")
    ap.add_argument("--client-core", type=int, default=0)
    ap.add_argument("--server-core", type=int, default=1)
    # internal: the processes the driver starts
    ap.add_argument("--role", choices=("drive", "server", "client"), default="drive", help=argparse.SUPPRESS)
    ap.add_argument("--impl", choices=("raw", "ours", "reference"), help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--phase", choices=("burst", "paced"), help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=("cumulative", "incremental"), help=argparse.SUPPRESS)
    ap.add_argument("--checkout", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.reference_checkout and not (args.reference_checkout / "language/gpt-oss-120b/backends").is_dir():
        ap.error(
            f"{args.reference_checkout} has no language/gpt-oss-120b/backends: not an"
            f" mlcommons/inference checkout"
        )
    if args.role == "server":
        serve(0, args.paced_interval_ms, args.stream_interval)
    elif args.role == "client":
        import uvloop

        print(json.dumps(uvloop.run(run_client(args))))
    else:
        drive(args)


if __name__ == "__main__":
    main()

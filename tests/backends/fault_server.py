"""Fault-injection HTTP server speaking SGLang /generate and OpenAI /v1/completions (test code).

The fault is chosen by the first path segment, so one process serves every fault:
    http://127.0.0.1:PORT/<fault>/generate, /<fault>/v1/completions, /<fault>/health
The request's answer is always the ids TOKEN_BASE + i, i < max_new_tokens, so a test knows exactly
which tokens the server sent before a fault ("endless" ignores max_new_tokens and never stops).
"busy_<n>_<retry>_<tag>" answers 503 to its first n requests (retry: "s<k>" sends Retry-After: k,
"date<k>" an HTTP date k seconds ahead, "none" no header), then correctly; GET /times/<fault> lists
when each request to it arrived (server monotonic seconds). Run: python tests/backends/fault_server.py
[--port N] [--incremental] [--token-delay S]; it prints "PORT <n>" once listening.
This file is the app and its launcher; the faulted answers are in fault_handlers.py beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from aiohttp import web

# Always run as a script (see above): its own folder is sys.path[0].
from fault_handlers import completions, generate


async def health(request: web.Request) -> web.Response:
    if request.match_info["fault"] == "unhealthy":
        return web.Response(status=503, text="still loading")
    return web.Response(status=200)


async def times(request: web.Request) -> web.Response:
    return web.json_response(request.app["times"].get(request.match_info["fault"], []))


async def stats(request: web.Request) -> web.Response:
    a = request.app
    return web.json_response(
        {"peak": a["peak"], "total": a["total"], "in_flight": a["in_flight"], "endless": a["endless"]}
    )


async def models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "fault-model", "object": "model"}]})


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--incremental", action="store_true")
    ap.add_argument("--token-delay", type=float, default=0.0)
    args = ap.parse_args()
    app = web.Application()
    app["incremental"] = args.incremental
    app["token_delay"] = args.token_delay
    app["in_flight"] = app["peak"] = app["total"] = app["endless"] = 0
    app["times"] = {}
    app.router.add_post("/{fault}/generate", generate)
    app.router.add_post("/{fault}/v1/completions", completions)
    app.router.add_get("/{fault}/health", health)
    app.router.add_get("/{fault}/v1/models", models)
    app.router.add_get("/stats", stats)
    app.router.add_get("/times/{fault}", times)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", args.port)
    await site.start()
    print(f"PORT {site._server.sockets[0].getsockname()[1]}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(0)

"""Idle pooled connections: the sglang and openai clients give a connection up after KEEPALIVE_S idle,
before a server's own keep-alive timeout closes it under a request (uvicorn's 5 s). The server here
answers once per connection and drops the connection on its second request, as a server does that
closes an idle connection just as a request is written onto it.
"""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from backends import http
from tests.backends.fault_handlers import completions, generate, sent_ids
from tests.backends.httpkit import BOTH, PARAMS, N, collect, make_backend

pytestmark = pytest.mark.timeout(60)

IDLE_S = 0.3  # the test's keep-alive limit; the pause between requests is well past it


async def _serve_once_per_connection():
    """An in-loop server with the fault server's handlers that closes a connection at its 2nd POST."""
    seen: dict[tuple, int] = {}

    @web.middleware
    async def once(request: web.Request, handler):
        if request.method != "POST":
            return await handler(request)
        peer = request.transport.get_extra_info("peername")
        seen[peer] = seen.get(peer, 0) + 1
        if seen[peer] > 1:
            request.transport.close()  # no reply: the client sees the connection drop
            return web.Response(status=500)
        return await handler(request)

    app = web.Application(middlewares=[once])
    app["incremental"], app["token_delay"] = False, 0.0
    app["in_flight"] = app["peak"] = app["total"] = app["endless"] = 0
    app["times"] = {}
    app.router.add_post("/{fault}/generate", generate)
    app.router.add_post("/{fault}/v1/completions", completions)
    app.router.add_get("/{fault}/health", lambda r: web.Response(status=200))
    # the openai client asks for the model name
    app.router.add_get("/{fault}/v1/models", lambda r: web.json_response({"data": [{"id": "m"}]}))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}/ok", seen


async def _two_requests(name: str, pause_s: float):
    runner, url, seen = await _serve_once_per_connection()
    try:
        async with make_backend(name, [url], max_concurrency=1) as backend:
            first = await collect(backend, [1, 2, 3], PARAMS)
            await asyncio.sleep(pause_s)
            second = await collect(backend, [1, 2, 3], PARAMS)
        return first, second, len(seen)
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("name", BOTH)
def test_a_connection_idle_past_keepalive_is_not_reused(name, monkeypatch):
    monkeypatch.setattr(http, "KEEPALIVE_S", IDLE_S)
    first, second, connections = asyncio.run(_two_requests(name, pause_s=3 * IDLE_S))
    assert first == (sent_ids(N), None)
    assert second == (sent_ids(N), None)  # a new connection, not the dropped one
    assert connections == 2


@pytest.mark.parametrize("name", BOTH)
def test_a_recently_used_connection_is_reused(name, monkeypatch):
    """The server above does drop a reused connection: without the keep-alive limit, that is the failure."""
    monkeypatch.setattr(http, "KEEPALIVE_S", 30.0)
    first, (got, err), connections = asyncio.run(_two_requests(name, pause_s=0.05))
    assert first == (sent_ids(N), None)
    assert got == [] and isinstance(err, http.StreamBrokenError)
    assert "lost before replying" in str(err)
    assert connections == 1


def test_keepalive_is_shorter_than_uvicorns():
    assert http.KEEPALIVE_S < 5.0  # uvicorn's timeout_keep_alive default (vLLM, SGLang)

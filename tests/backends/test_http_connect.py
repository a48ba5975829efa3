"""The sglang and openai clients reaching their servers: refused connections and unknown hosts fail
fast naming the URL, a server that comes up within the grace (or reports progress while unhealthy) is
waited for, and a server that goes away mid-run fails every request without a hang.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest

from backends.http import (
    ServerConnectError,
    StreamBrokenError,
)
from harness.config import SamplingParams
from tests.backends.fault_handlers import sent_ids
from tests.backends.httpkit import (
    BOTH,
    FAULT_SERVER,
    N,
    collect,
    free_port,
    make_backend,
    run_one,
    start_process,
    stop_process,
)

pytestmark = pytest.mark.timeout(60)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("name", BOTH)
def test_refused_connection_fails_fast_with_the_url(name):
    """Nothing listens: not a server that is loading. One error after the short grace, not --ready-timeout."""
    from backends import http

    url = f"http://127.0.0.1:{free_port()}"

    async def main():
        async with make_backend(name, [url], ready_timeout_s=600.0):
            pass

    t0 = time.monotonic()
    with pytest.raises(ServerConnectError) as e:
        asyncio.run(main())
    elapsed = time.monotonic() - t0
    assert str(e.value).startswith(f"cannot reach the {name} server at {url} (connection refused, for ")
    assert str(e.value).endswith("start the server or fix --server-url")
    assert http.UNREACHABLE_GRACE_S <= elapsed < 45  # the grace was waited, the 600 s were not


@pytest.mark.timeout(90)
def test_unknown_host_fails_fast_with_the_url():
    url = "http://no-such-host.invalid:30000"

    async def main():
        async with make_backend("sglang", [url], ready_timeout_s=600.0):
            pass

    t0 = time.monotonic()
    with pytest.raises(
        ServerConnectError,
        match=r"cannot reach the sglang server at http://no-such-host\.invalid:30000 "
        r"\(host not found: ",
    ):
        asyncio.run(main())
    assert time.monotonic() - t0 < 45


def test_server_that_starts_within_the_grace_is_used():
    """A server launched together with the run refuses for a moment, then answers."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(FAULT_SERVER), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        got, err = asyncio.run(run_one("sglang", f"http://127.0.0.1:{port}/ok", ready_timeout_s=600.0))
    finally:
        stop_process(proc)
    assert err is None and got == sent_ids(N)


def test_unhealthy_server_is_waited_for_with_progress_lines(fault_url, monkeypatch, capsys):
    from backends import http

    monkeypatch.setattr(http, "READY_PROGRESS_S", 0.4)

    async def main():
        async with make_backend("sglang", [f"{fault_url}/unhealthy"], ready_timeout_s=4.0):
            pass

    t0 = time.monotonic()
    with pytest.raises(ServerConnectError) as e:
        asyncio.run(main())
    assert time.monotonic() - t0 >= 4.0  # "not ready" is waited for until --ready-timeout
    assert str(e.value).startswith(
        f"sglang server {fault_url}/unhealthy not ready after 4 s (GET /health: HTTP 503: still loading)"
    )
    progress = capsys.readouterr().err.splitlines()
    assert len(progress) >= 2, progress  # one at once, then one every READY_PROGRESS_S
    assert all(
        line.startswith(f"waiting for the sglang server {fault_url}/unhealthy to be ready (")
        and line.endswith("GET /health: HTTP 503: still loading")
        for line in progress
    ), progress


def test_server_going_away_mid_run_fails_every_request_and_nothing_hangs():
    """Killed with requests in flight: each gets a named error after sent ids; later ones cannot connect."""
    proc, port = start_process([sys.executable, str(FAULT_SERVER), "--token-delay", "0.02"], "PORT ")
    url = f"http://127.0.0.1:{port}/ok"
    n = 200

    async def main():
        async with make_backend("sglang", [url], first_token_timeout_s=5.0) as backend:
            tasks = [
                asyncio.create_task(collect(backend, [i], SamplingParams(max_new_tokens=n))) for i in range(8)
            ]
            await asyncio.sleep(0.5)
            os.kill(proc.pid, signal.SIGKILL)
            results = await asyncio.gather(*tasks)
            after = await collect(backend, [9], SamplingParams(max_new_tokens=n))
            return results, after

    try:
        t0 = time.monotonic()
        results, after = asyncio.run(main())
        assert time.monotonic() - t0 < 30  # first-token timeout 5 s, not a hang
    finally:
        stop_process(proc)
    for got, err in results:
        assert isinstance(err, StreamBrokenError) and err.kind == "stream_cut", repr(err)
        assert 0 < len(got) < n and got == sent_ids(n)[: len(got)]
    got, err = after
    # A new connection is refused; a pooled keep-alive one is reset before any reply.
    assert got == [] and (
        isinstance(err, ServerConnectError)
        and "cannot connect" in str(err)
        or isinstance(err, StreamBrokenError)
        and "lost before replying" in str(err)
    ), repr(err)

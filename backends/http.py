"""Shared HTTP client for the sglang and openai backends (their shared flags: backends/http_options.py).

One pooled aiohttp session per run, a concurrency cap, least-outstanding-first spreading over
several servers, connect / first-token / total timeouts, opt-in retries with a jittered backoff
that honours Retry-After, a /health ready check, a hard stop at the request's max_new_tokens, and
the SSE framing of backends/sse.py. Every failure raises a BackendError subclass whose class names
the cause and whose message carries the server's own words.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from backends.fd_limits import check_fd_limit, ensure_fd_limit, fds_needed
from backends.http_errors import (  # re-exported: the error names the backends' users see
    HttpBackendError,
    MalformedReplyError,
    ServerConnectError,
    ServerHTTPError,
    ServerReportedError,
    ServerTimeoutError,
    StreamBrokenError,
    TokenCountError,
    TokenLimitExceededError,
)
from backends.http_options import HttpOptions
from backends.http_retry import parse_retry_after, retry_delay
from backends.sse import StreamDecoder, sse_tokens

__all__ = [
    "HttpBackendError",
    "MalformedReplyError",
    "ServerConnectError",
    "ServerHTTPError",
    "ServerReportedError",
    "ServerTimeoutError",
    "StreamBrokenError",
    "TokenCountError",
    "TokenLimitExceededError",
    "HttpOptions",
    "HttpClient",
]

DEFAULT_MAX_CONCURRENCY = 1024
_ERROR_BODY_LIMIT = 4096  # bytes of an error reply quoted in the message

# The ready check. A server that answers, even "503 loading", is waited for up to --ready-timeout;
# one that nobody answers for (connection refused, unknown host, no route) is most likely a wrong
# URL, so it gets only this grace, which covers a server started together with the run.
UNREACHABLE_GRACE_S = 5.0
READY_POLL_S = 0.5
READY_PROGRESS_S = 5.0  # a progress line on stderr this often while a server is not ready
# A pooled connection idle this long is closed, not reused. uvicorn (vLLM's and SGLang's servers)
# closes idle keep-alive connections after 5 s; a POST written onto one as the server closes it
# fails with "Server disconnected" before any reply (a failed query in a CI Server run at 8.5 QPS).
# Giving connections up first, on the client, leaves no such race.
KEEPALIVE_S = 4.0


# ----------------------------------------------------------------------------- servers


def normalize_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")) or len(url.split("://", 1)[1]) == 0:
        raise ValueError(f"--server-url must look like http://HOST:PORT, got '{url}'")
    return url


@dataclass(slots=True)
class Server:
    url: str
    outstanding: int = 0
    sent: int = 0
    failed: int = 0


class ServerPool:
    """Least outstanding requests first; ties go round-robin so idle servers share the load evenly."""

    def __init__(self, urls: list[str]) -> None:
        if not urls:
            raise ValueError("no server URL")
        self.servers = [Server(u) for u in urls]
        self._turn = itertools.count()

    def pick(self, avoid: Server | None = None) -> Server:
        servers = self.servers
        if avoid is not None and len(servers) > 1:
            servers = [s for s in servers if s is not avoid]
        start = next(self._turn) % len(servers)
        best = None
        for i in range(len(servers)):
            s = servers[(start + i) % len(servers)]
            if best is None or s.outstanding < best.outstanding:
                best = s
        assert best is not None
        return best


def error_message(body: bytes) -> str:
    """The server's message from an error reply: {"error": {"message"}} (SGLang, vLLM) or raw text."""
    import orjson

    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:_ERROR_BODY_LIMIT].decode("utf-8", "replace").strip() or "(empty body)"
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if isinstance(err, str):
            return err
        if "message" in obj:
            return str(obj["message"])
    return body[:_ERROR_BODY_LIMIT].decode("utf-8", "replace")


# ----------------------------------------------------------------------------- client


class HttpClient:
    """The pooled session, the concurrency cap and the server pool of one backend for one run."""

    def __init__(
        self,
        backend: str,
        urls: tuple[str, ...],
        default_url: str,
        opts: HttpOptions,
        max_concurrency: int | None,
        timeout_s: float | None,
    ) -> None:
        self.backend = backend
        self.opts = opts
        self.pool = ServerPool([normalize_url(u) for u in (urls or (default_url,))])
        self.max_concurrency = max_concurrency or DEFAULT_MAX_CONCURRENCY
        if self.max_concurrency < 1:
            raise ValueError(f"--max-concurrency must be >= 1, got {self.max_concurrency}")
        check_fd_limit(self.max_concurrency)
        self.timeout_s = timeout_s
        self.retried = 0
        self.session: Any = None
        self._slots: asyncio.Semaphore | None = None

    async def __aenter__(self) -> HttpClient:
        import aiohttp

        ensure_fd_limit(fds_needed(self.max_concurrency))
        self._slots = asyncio.Semaphore(self.max_concurrency)
        connector = aiohttp.TCPConnector(
            limit=self.max_concurrency, limit_per_host=0, ttl_dns_cache=300, keepalive_timeout=KEEPALIVE_S
        )
        self.session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None),
            read_bufsize=1 << 20,
            skip_auto_headers=("User-Agent",),
        )
        try:
            await self._wait_ready()
        except BaseException:
            await self.session.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None

    async def _wait_ready(self) -> None:
        """GET /health on every server until 200. Polling is the only signal a remote server gives."""
        deadline = time.monotonic() + self.opts.ready_timeout_s
        for server in self.pool.servers:
            await self._wait_one_ready(server, deadline)

    async def _wait_one_ready(self, server: Server, deadline: float) -> None:
        import aiohttp

        url = server.url + "/health"
        probe = aiohttp.ClientTimeout(total=5.0, sock_connect=self.opts.connect_timeout_s)
        grace = min(UNREACHABLE_GRACE_S, self.opts.ready_timeout_s)
        start = time.monotonic()
        unreachable_since: float | None = None
        next_progress = start
        while True:
            try:
                async with self.session.get(url, timeout=probe) as resp:
                    if resp.status == 200:
                        return
                    last = f"HTTP {resp.status}: {error_message(await resp.read())}"
                unreachable_since = None
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as e:
                # Refused, unknown host, no route, TLS failure: nothing is loading there.
                now = time.monotonic()
                unreachable_since = unreachable_since or now
                if now - unreachable_since >= grace or now >= deadline:
                    raise ServerConnectError(
                        f"cannot reach the {self.backend} server at {server.url} ({_connect_reason(e)}, "
                        f"for {now - start:.0f} s); start the server or fix --server-url"
                    ) from None
                await asyncio.sleep(READY_POLL_S)
                continue
            except (TimeoutError, aiohttp.ClientError) as e:  # it accepted: busy or starting
                last = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            now = time.monotonic()
            if now >= deadline:
                raise ServerConnectError(
                    f"{self.backend} server {server.url} not ready after {self.opts.ready_timeout_s:g} s "
                    f"(GET /health: {last}); wait until it has loaded, raise --ready-timeout, or fix "
                    "--server-url"
                )
            if now >= next_progress:
                print(
                    f"waiting for the {self.backend} server {server.url} to be ready ({now - start:.0f} s of "
                    f"--ready-timeout {self.opts.ready_timeout_s:g}): GET /health: {last}",
                    file=sys.stderr,
                    flush=True,
                )
                next_progress = now + READY_PROGRESS_S
            await asyncio.sleep(min(READY_POLL_S, max(0.0, deadline - now)))

    async def get_json(self, path: str) -> Any:
        """GET from the first server (setup-time queries such as /v1/models)."""
        import aiohttp
        import orjson

        url = self.pool.servers[0].url + path
        try:
            async with self.session.get(url, timeout=aiohttp.ClientTimeout(total=30)) as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise ServerHTTPError(
                        f"HTTP {resp.status} from {url}: {error_message(body)}", resp.status
                    )
        except (TimeoutError, aiohttp.ClientError) as e:
            raise ServerConnectError(f"GET {url} failed: {type(e).__name__}: {e}") from e
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError as e:
            raise MalformedReplyError(f"GET {url} returned malformed JSON: {e}") from e

    async def request(
        self,
        path: str,
        body: bytes,
        decoder: Callable[[str], StreamDecoder],
        stream: bool,
        parse_whole: Callable[[bytes, str], list[int]],
        limit: int,
    ) -> AsyncIterator[list[int]]:
        """POST body to the least busy server; yield ids as they arrive, never more than `limit`
        (the request's max_new_tokens). Retries, after a backoff, only before any token."""
        assert self._slots is not None, "use the backend as `async with backend:`"
        async with self._slots:
            failed: Server | None = None
            for attempt in itertools.count():
                server = self.pool.pick(avoid=failed)
                got = 0
                try:
                    async with aclosing(self._once(server, path, body, decoder, stream, parse_whole)) as it:
                        async for ids in it:
                            if got + len(ids) > limit:
                                # A server that ignores max_new_tokens could stream for ever: keep
                                # what the request asked for, then close the stream (leaving `aclosing`).
                                keep, got = limit - got, limit
                                if keep:
                                    yield ids[:keep]
                                raise TokenLimitExceededError(
                                    f"{server.url}{path} sent more than max_new_tokens={limit} token ids; "
                                    f"the first {limit} are kept and the stream was closed"
                                )
                            got += len(ids)
                            yield ids
                    return
                except HttpBackendError as e:
                    server.failed += 1
                    if got or not e.retryable or attempt >= self.opts.retries:
                        raise
                    delay = retry_delay(attempt, getattr(e, "retry_after_s", None))
                    if delay is None:
                        raise
                    self.retried += 1
                    failed = server
                    await asyncio.sleep(delay)

    async def _once(
        self,
        server: Server,
        path: str,
        body: bytes,
        decoder: Callable[[str], StreamDecoder],
        stream: bool,
        parse_whole: Callable[[bytes, str], list[int]],
    ) -> AsyncIterator[list[int]]:
        import aiohttp

        url = server.url + path
        silence = self.opts.first_token_timeout_s if stream else None
        timeout = aiohttp.ClientTimeout(
            total=self.timeout_s, sock_connect=self.opts.connect_timeout_s, sock_read=silence
        )
        first_deadline = time.monotonic() + silence if silence else None
        server.outstanding += 1
        server.sent += 1
        got_headers = False
        try:
            async with self.session.post(
                url, data=body, timeout=timeout, headers={"Content-Type": "application/json"}
            ) as resp:
                got_headers = True
                if resp.status != 200:
                    text = error_message(await resp.read())
                    raise ServerHTTPError(
                        f"HTTP {resp.status} from {url}: {text}",
                        resp.status,
                        parse_retry_after(resp.headers.get("Retry-After")),
                    )
                if not stream:
                    yield parse_whole(await resp.read(), url)
                    return
                dec = decoder(url)
                async with aclosing(sse_tokens(resp, dec, url, first_deadline)) as it:
                    async for ids in it:
                        yield ids
                if not dec.finished:
                    raise StreamBrokenError(f"stream from {url} ended before its final chunk")
        except aiohttp.ConnectionTimeoutError as e:
            raise ServerConnectError(
                f"cannot connect to {url}: no answer within the connect timeout "
                f"({self.opts.connect_timeout_s:g} s)"
            ) from e
        except aiohttp.SocketTimeoutError as e:
            raise ServerTimeoutError(f"{url} sent nothing for {silence:g} s (first-token timeout)") from e
        except TimeoutError as e:
            raise ServerTimeoutError(
                f"request to {url} exceeded the total timeout ({self.timeout_s} s)"
            ) from e
        except aiohttp.ClientConnectorError as e:
            raise ServerConnectError(f"cannot connect to {url}: {e.os_error or e}") from e
        except (
            aiohttp.ClientPayloadError,
            aiohttp.ServerDisconnectedError,
            aiohttp.ClientOSError,
            ConnectionError,
        ) as e:
            where = "mid-stream" if got_headers else "before replying"
            raise StreamBrokenError(f"connection to {url} lost {where}: {type(e).__name__}: {e}") from e
        except aiohttp.ClientResponseError as e:
            raise MalformedReplyError(f"bad HTTP reply from {url}: {e.message}") from e
        finally:
            server.outstanding -= 1

    def describe(self) -> dict[str, Any]:
        import aiohttp

        o = self.opts
        return {
            "server_urls": [s.url for s in self.pool.servers],
            "max_concurrency": self.max_concurrency,
            "stream": o.stream,
            "retries": o.retries,
            "timeouts_s": {
                "connect": o.connect_timeout_s,
                "first_token": o.first_token_timeout_s,
                "total": self.timeout_s,
                "ready": o.ready_timeout_s,
            },
            "requests": {s.url: {"sent": s.sent, "failed": s.failed} for s in self.pool.servers},
            "retried_requests": self.retried,
            "aiohttp": aiohttp.__version__,
        }


def _connect_reason(e: Exception) -> str:
    """The OS's words for a failed connect: 'connection refused', 'host not found: ...', ..."""
    import os
    import socket

    import aiohttp

    if isinstance(e, aiohttp.ConnectionTimeoutError):
        return "no answer within the connect timeout"
    err = getattr(e, "os_error", None)
    if isinstance(err, socket.gaierror):
        return f"host not found: {err.strerror}"
    if isinstance(err, OSError) and err.errno and err.errno > 0:
        return os.strerror(err.errno).lower()
    return str(err or e)

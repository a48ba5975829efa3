"""Shared HTTP client for the sglang and openai backends, and the flags they share (HttpOptions).

One pooled aiohttp session per run, a concurrency cap, least-outstanding-first spreading over
several servers, connect / first-token / total timeouts, opt-in retries, a /health ready check, and
the SSE framing of backends/sse.py. Every failure raises a BackendError subclass whose class names the cause and
whose message carries the server's own words.
"""

from __future__ import annotations

import asyncio
import itertools
import resource
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from backends.http_errors import (  # re-exported: the error names the backends' users see
    HttpBackendError,
    MalformedReplyError,
    ServerConnectError,
    ServerHTTPError,
    ServerReportedError,
    ServerTimeoutError,
    StreamBrokenError,
    TokenCountError,
)
from backends.sse import StreamDecoder, sse_tokens

__all__ = ["HttpBackendError", "MalformedReplyError", "ServerConnectError", "ServerHTTPError", "ServerReportedError",
           "ServerTimeoutError", "StreamBrokenError", "TokenCountError", "HttpOptions", "HttpClient"]

DEFAULT_MAX_CONCURRENCY = 1024
_ERROR_BODY_LIMIT = 4096  # bytes of an error reply quoted in the message


# ----------------------------------------------------------------------------- options


def _off_at_zero(text: str) -> float | None:
    value = float(text)
    return None if value == 0 else value


@dataclass(frozen=True, slots=True)
class HttpOptions:
    """Flags of the sglang and openai backends (core flags such as --server-url live in RunConfig).
    Each field with "help" metadata is a flag (harness/cli.py)."""

    retries: int = field(default=0, metadata={
        "help": "retry a request that failed before its first token (connect error, HTTP 5xx/429, cut stream) "
                "up to N times on the least busy server; 0: every failure counts", "metavar": "N"})
    connect_timeout_s: float = field(default=10.0, metadata={
        "help": "seconds to open a TCP connection", "flag": "--connect-timeout", "metavar": "S"})
    first_token_timeout_s: float | None = field(default=600.0, metadata={  # also the longest silence mid-stream
        "help": "fail a streamed request with no token S seconds after it was sent, or silent for S seconds "
                "mid-stream; 0 disables", "flag": "--first-token-timeout", "metavar": "S", "type": _off_at_zero})
    ready_timeout_s: float = field(default=600.0, metadata={
        "help": "seconds to wait for every server's GET /health to answer 200", "flag": "--ready-timeout",
        "metavar": "S"})
    stream: bool = field(default=True, metadata={
        "help": "stream tokens over SSE; --no-stream waits for whole replies"})

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")
        for name in ("connect_timeout_s", "first_token_timeout_s", "ready_timeout_s"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < float("inf"):
                raise ValueError(f"{name} must be a number of seconds >= 0, got {value}")


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

    def __init__(self, backend: str, urls: tuple[str, ...], default_url: str, opts: HttpOptions,
                 max_concurrency: int | None, timeout_s: float | None) -> None:
        self.backend = backend
        self.opts = opts
        self.pool = ServerPool([normalize_url(u) for u in (urls or (default_url,))])
        self.max_concurrency = max_concurrency or DEFAULT_MAX_CONCURRENCY
        if self.max_concurrency < 1:
            raise ValueError(f"--max-concurrency must be >= 1, got {self.max_concurrency}")
        self.timeout_s = timeout_s
        self.retried = 0
        self.session: Any = None
        self._slots: asyncio.Semaphore | None = None

    async def __aenter__(self) -> HttpClient:
        import aiohttp

        _ensure_fd_limit(self.max_concurrency + 64)
        self._slots = asyncio.Semaphore(self.max_concurrency)
        connector = aiohttp.TCPConnector(limit=self.max_concurrency, limit_per_host=0,
                                         ttl_dns_cache=300)
        self.session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=None), read_bufsize=1 << 20,
            skip_auto_headers=("User-Agent",))
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
        import aiohttp

        deadline = time.monotonic() + self.opts.ready_timeout_s
        probe = aiohttp.ClientTimeout(total=5.0, sock_connect=self.opts.connect_timeout_s)
        for server in self.pool.servers:
            last = "no answer"
            while True:
                try:
                    async with self.session.get(server.url + "/health", timeout=probe) as resp:
                        if resp.status == 200:
                            break
                        last = f"HTTP {resp.status}: {error_message(await resp.read())}"
                except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                    last = f"{type(e).__name__}: {e}"
                if time.monotonic() >= deadline:
                    raise ServerConnectError(
                        f"{self.backend} server {server.url} not ready after {self.opts.ready_timeout_s:g} s "
                        f"(GET /health: {last}); start it or fix --server-url")
                await asyncio.sleep(0.5)

    async def get_json(self, path: str) -> Any:
        """GET from the first server (setup-time queries such as /v1/models)."""
        import aiohttp
        import orjson

        url = self.pool.servers[0].url + path
        try:
            async with self.session.get(url, timeout=aiohttp.ClientTimeout(total=30)) as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise ServerHTTPError(f"HTTP {resp.status} from {url}: {error_message(body)}", resp.status)
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            raise ServerConnectError(f"GET {url} failed: {type(e).__name__}: {e}") from e
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError as e:
            raise MalformedReplyError(f"GET {url} returned malformed JSON: {e}") from e

    async def request(self, path: str, body: bytes, decoder: Callable[[str], StreamDecoder],
                      stream: bool, parse_whole: Callable[[bytes, str], list[int]]) -> AsyncIterator[list[int]]:
        """POST body to the least busy server; yield ids as they arrive. Retries only before any token."""
        assert self._slots is not None, "use the backend as `async with backend:`"
        async with self._slots:
            failed: Server | None = None
            for attempt in itertools.count():
                server = self.pool.pick(avoid=failed)
                yielded = False
                try:
                    async with aclosing(self._once(server, path, body, decoder, stream, parse_whole)) as it:
                        async for ids in it:
                            yielded = True
                            yield ids
                    return
                except HttpBackendError as e:
                    server.failed += 1
                    if yielded or not e.retryable or attempt >= self.opts.retries:
                        raise
                    self.retried += 1
                    failed = server

    async def _once(self, server: Server, path: str, body: bytes, decoder: Callable[[str], StreamDecoder],
                    stream: bool, parse_whole: Callable[[bytes, str], list[int]]) -> AsyncIterator[list[int]]:
        import aiohttp

        url = server.url + path
        silence = self.opts.first_token_timeout_s if stream else None
        timeout = aiohttp.ClientTimeout(total=self.timeout_s, sock_connect=self.opts.connect_timeout_s,
                                        sock_read=silence)
        first_deadline = time.monotonic() + silence if silence else None
        server.outstanding += 1
        server.sent += 1
        got_headers = False
        try:
            async with self.session.post(url, data=body, timeout=timeout,
                                         headers={"Content-Type": "application/json"}) as resp:
                got_headers = True
                if resp.status != 200:
                    text = error_message(await resp.read())
                    raise ServerHTTPError(f"HTTP {resp.status} from {url}: {text}", resp.status)
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
                f"({self.opts.connect_timeout_s:g} s)") from e
        except aiohttp.SocketTimeoutError as e:
            raise ServerTimeoutError(f"{url} sent nothing for {silence:g} s (first-token timeout)") from e
        except asyncio.TimeoutError as e:
            raise ServerTimeoutError(f"request to {url} exceeded the total timeout ({self.timeout_s} s)") from e
        except aiohttp.ClientConnectorError as e:
            raise ServerConnectError(f"cannot connect to {url}: {e.os_error or e}") from e
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError,
                aiohttp.ClientOSError, ConnectionError) as e:
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
            "timeouts_s": {"connect": o.connect_timeout_s, "first_token": o.first_token_timeout_s,
                           "total": self.timeout_s, "ready": o.ready_timeout_s},
            "requests": {s.url: {"sent": s.sent, "failed": s.failed} for s in self.pool.servers},
            "retried_requests": self.retried,
            "aiohttp": aiohttp.__version__,
        }


def _ensure_fd_limit(needed: int) -> None:
    """Raise the soft open-files limit so the concurrency cap, not EMFILE, bounds the sockets."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        if target < needed:
            raise ValueError(f"--max-concurrency needs about {needed} open files but the hard limit is "
                             f"{hard}; lower --max-concurrency or raise `ulimit -n`")

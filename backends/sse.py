"""SSE framing for the HTTP backends: complete lines per read, handed to a per-request decoder.

The framing only searches the end of each read for its last newline; the decoder chooses which
lines it reads (all of them for deltas, only the newest for SGLang's cumulative ids).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from typing import Any, Protocol

from backends.http_errors import HttpBackendError, MalformedReplyError, ServerTimeoutError, StreamBrokenError


class StreamDecoder(Protocol):
    """Turns one request's SSE body into token ids; raises HttpBackendError on bad input."""

    finished: bool  # the final chunk (with a finish reason) was seen

    def feed_block(self, buf: bytes, start: int, end: int) -> None:
        """Complete SSE lines buf[start:end] (end is just past a newline), without copying them."""

    def take(self) -> list[int]:
        """The ids decoded since the last take (a new list each time; never mutated later)."""


SSE_FIELDS = (b":", b"event:", b"id:", b"retry:")


def data_payloads(buf: bytes, start: int, end: int, url: str) -> Iterator[tuple[int, int]]:
    """(start, end) of each `data:` payload in complete lines buf[start:end], first to last."""
    pos = start
    while pos < end:
        nl = buf.find(b"\n", pos, end)
        stop = nl - 1 if nl > pos and buf[nl - 1] == 13 else nl  # tolerate \r\n
        if stop > pos:
            if buf.startswith(b"data:", pos):
                yield (pos + 6 if buf.startswith(b" ", pos + 5) else pos + 5), stop
            elif not buf.startswith(SSE_FIELDS, pos):
                raise MalformedReplyError(
                    f"malformed SSE line from {url}: {buf[pos : min(stop, pos + 200)]!r}"
                )
        pos = nl + 1


async def sse_tokens(
    resp: Any, decoder: StreamDecoder, url: str, first_deadline: float | None
) -> AsyncIterator[list[int]]:
    """Hand the complete lines of each read to the decoder and yield the ids it found.

    Only the end of each read is searched (for its last newline); the decoder decides which lines
    it needs to look at, so the framing never scans or copies a payload. All events that arrived
    in one read cost one yield.
    """
    pending: list[bytes] = []
    got_token = False
    read = resp.content.readany
    while True:
        chunk = await read()
        if not chunk:
            break
        nl = chunk.rfind(b"\n")
        if nl < 0:
            pending.append(chunk)
            continue
        if pending:
            pending.append(chunk)
            buf = b"".join(pending)
            pending.clear()
            end = len(buf) - len(chunk) + nl + 1
        else:
            buf, end = chunk, nl + 1
        try:
            decoder.feed_block(buf, 0, end)
        except HttpBackendError:
            # Hand over the good ids that arrived in the same read as the fault, then fail.
            ids = decoder.take()
            if ids:
                yield ids
            raise
        if end < len(buf):
            pending.append(buf[end:])
        ids = decoder.take()
        if ids:
            got_token = True
            yield ids
        elif not got_token and first_deadline is not None and time.monotonic() > first_deadline:
            raise ServerTimeoutError(f"no token from {url} within the first-token timeout")
    if pending and any(p.strip() for p in pending):
        raise StreamBrokenError(f"stream from {url} ended inside an event (incomplete last line)")

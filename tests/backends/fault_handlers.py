"""The fault server's answers (fault_server.py runs them): /generate and /v1/completions, faulted by name."""

from __future__ import annotations

import asyncio
import itertools
import time
from email.utils import formatdate

import orjson
from aiohttp import web

TOKEN_BASE = 1000
# Any fault name starting with "ok" answers correctly (several URLs of one healthy server).
FAULTS = (
    "ok",
    "http500",
    "cut",
    "stall",
    "stall_first",
    "malformed",
    "mismatch",
    "error_event",
    "abort",
    "no_final",
    "lower_count",
    "text_only",
    "unhealthy",
    "junk_line",
    "garbage_ids",
    "endless",
    "busy_<n>_<retry>_<tag>",
)
ENDLESS_CHUNK_DELAY_S = 0.001  # an endless stream yields to the loop so that a client's close is seen


def sent_ids(n: int) -> list[int]:
    return [TOKEN_BASE + i for i in range(n)]


def before_fault(n: int) -> int:
    """How many tokens a faulty stream sends before its fault."""
    return n // 2


async def _sse(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    return resp


def _sglang_chunk(
    ids: list[int], upto: int, since: int, incremental: bool, finish=None, count: int | None = None
) -> bytes:
    out = ids[since:upto] if incremental else ids[:upto]
    meta = {
        "id": "fault",
        "finish_reason": finish,
        "prompt_tokens": 3,
        "completion_tokens": upto if count is None else count,
        "cached_tokens": 0,
    }
    return b"data: " + orjson.dumps({"output_ids": out, "meta_info": meta}) + b"\n\n"


class _InFlight:
    """Counts the requests being answered, to check the client's concurrency cap."""

    def __init__(self, app: web.Application) -> None:
        self.app = app

    def __enter__(self) -> None:
        a = self.app
        a["in_flight"] += 1
        a["total"] += 1
        a["peak"] = max(a["peak"], a["in_flight"])

    def __exit__(self, *exc: object) -> None:
        self.app["in_flight"] -= 1


class _Endless:
    """Counts the endless streams still being written, to check that the client closed them."""

    def __init__(self, app: web.Application) -> None:
        self.app = app

    def __enter__(self) -> None:
        self.app["endless"] += 1

    def __exit__(self, *exc: object) -> None:
        self.app["endless"] -= 1


def _busy(request: web.Request) -> web.Response | None:
    """The 503 of a busy_<n>_<retry>_<tag> fault while its first n requests last; None afterwards."""
    fault = request.match_info["fault"]
    times = request.app["times"].setdefault(fault, [])
    times.append(time.monotonic())
    if not fault.startswith("busy_"):
        return None
    _, n, retry, _tag = fault.split("_", 3)
    if len(times) > int(n):
        return None
    headers = {}
    if retry.startswith("s"):
        headers["Retry-After"] = retry[1:]
    elif retry.startswith("date"):
        headers["Retry-After"] = formatdate(time.time() + float(retry[4:]), usegmt=True)
    return web.json_response(
        {"error": {"message": "injected overload: try again later"}}, status=503, headers=headers
    )


async def generate(request: web.Request) -> web.StreamResponse:
    with _InFlight(request.app):
        return _busy(request) or await _generate(request)


async def _generate(request: web.Request) -> web.StreamResponse:
    app = request.app
    fault = request.match_info["fault"]
    body = orjson.loads(await request.read())
    n = body["sampling_params"]["max_new_tokens"]
    ids = sent_ids(n)
    k = before_fault(n)
    inc = app["incremental"]
    delay = app["token_delay"]
    if fault == "http500":
        return web.json_response({"error": {"message": "injected failure: out of memory"}}, status=500)
    if fault == "endless":
        return await _sglang_endless(request, body, inc)
    if not body.get("stream"):
        if fault == "mismatch":
            return web.json_response(
                {
                    "output_ids": ids,
                    "meta_info": {"completion_tokens": n + 1, "finish_reason": {"type": "length"}},
                }
            )
        if fault == "malformed":
            return web.Response(body=b'{"output_ids": [1, 2,', content_type="application/json")
        return web.json_response(
            {
                "output_ids": ids,
                "meta_info": {
                    "id": "fault",
                    "finish_reason": {"type": "length", "length": n},
                    "prompt_tokens": 3,
                    "completion_tokens": n,
                    "cached_tokens": 0,
                    "e2e_latency": 0.0,
                },
            }
        )
    resp = await _sse(request)
    if fault == "stall_first":
        await asyncio.sleep(3600)
    upto = 0
    for upto in range(1, n + 1):
        if upto == k + 1 and fault in (
            "cut",
            "stall",
            "malformed",
            "error_event",
            "no_final",
            "lower_count",
            "junk_line",
            "garbage_ids",
        ):
            break
        if delay:
            await asyncio.sleep(delay)
        final = {"type": "length", "length": n} if upto == n else None
        if upto == n and fault == "abort":
            final = {"type": "abort", "message": "injected abort"}
        count = upto + 1 if (fault == "mismatch" and upto == n) else None
        await resp.write(_sglang_chunk(ids, upto, upto - 1, inc, final, count))
    else:
        await resp.write(b"data: [DONE]\n\n")
        return resp
    # A fault after k good chunks, a moment later so that the client has read them.
    await asyncio.sleep(0.05)
    if fault == "cut":
        request.transport.close()  # no terminating chunk: the body ends mid-stream
    elif fault == "stall":
        await asyncio.sleep(3600)
    elif fault == "malformed":
        await resp.write(b'data: {"output_ids": [1000, 10\n\n')
    elif fault == "error_event":
        await resp.write(
            b'data: {"error": {"message": "injected engine error", "type": "InternalError", '
            b'"code": 500}}\n\ndata: [DONE]\n\n'
        )
    elif fault == "no_final":
        await resp.write(b"data: [DONE]\n\n")
    elif fault == "lower_count":
        await resp.write(_sglang_chunk(ids, k, k, inc, None, count=k - 2))
    elif fault == "junk_line":
        await resp.write(b"<html>502 Bad Gateway</html>\n")
    elif fault == "garbage_ids":
        await resp.write(
            b'data: {"output_ids":['
            + b",".join(str(i).encode() for i in ids[:k])
            + b',"x"],"meta_info":{"id":"f","finish_reason":null,"completion_tokens":'
            + str(k + 1).encode()
            + b"}}\n\n"
        )
    return resp


async def _sglang_endless(request: web.Request, body: dict, inc: bool) -> web.StreamResponse:
    """Ignores max_new_tokens: twice as many ids whole, or a stream that never ends."""
    n = body["sampling_params"]["max_new_tokens"]
    if not body.get("stream"):
        ids = sent_ids(2 * n)
        return web.json_response(
            {
                "output_ids": ids,
                "meta_info": {
                    "id": "fault",
                    "finish_reason": {"type": "length", "length": 2 * n},
                    "prompt_tokens": 3,
                    "completion_tokens": 2 * n,
                    "cached_tokens": 0,
                    "e2e_latency": 0.0,
                },
            }
        )
    resp = await _sse(request)
    ids: list[int] = []
    with _Endless(request.app):
        while True:  # ends when the client goes away (the write raises)
            ids.append(TOKEN_BASE + len(ids))
            await resp.write(_sglang_chunk(ids, len(ids), len(ids) - 1, inc))
            await asyncio.sleep(ENDLESS_CHUNK_DELAY_S)


async def completions(request: web.Request) -> web.StreamResponse:
    with _InFlight(request.app):
        return _busy(request) or await _completions(request)


async def _completions(request: web.Request) -> web.StreamResponse:
    fault = request.match_info["fault"]
    body = orjson.loads(await request.read())
    n = body["max_tokens"]
    ids = sent_ids(n)
    k = before_fault(n)
    if fault == "http500":
        return web.json_response(
            {
                "error": {
                    "message": "injected failure: out of memory",
                    "type": "InternalError",
                    "param": None,
                    "code": 500,
                }
            },
            status=500,
        )
    ret_ids = bool(body.get("return_token_ids")) and fault != "text_only"
    if fault == "endless":
        n, ids = 2 * n, sent_ids(2 * n)

    def choice(delta: list[int], reason):
        c = {"index": 0, "text": "x" * len(delta), "logprobs": None, "finish_reason": reason}
        if ret_ids:
            c["token_ids"] = delta
        return c

    if not body.get("stream"):
        count = n + 1 if fault == "mismatch" else n
        return web.json_response(
            {
                "id": "c",
                "object": "text_completion",
                "model": "fault-model",
                "choices": [choice(ids, "length")],
                "usage": {"prompt_tokens": 3, "completion_tokens": count, "total_tokens": 3 + count},
            }
        )
    resp = await _sse(request)
    if fault == "stall_first":
        await asyncio.sleep(3600)
    if fault == "endless":
        with _Endless(request.app):
            for i in itertools.count():  # ends when the client goes away (the write raises)
                chunk = {
                    "id": "c",
                    "object": "text_completion",
                    "model": "fault-model",
                    "choices": [choice([TOKEN_BASE + i], None)],
                }
                await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
                await asyncio.sleep(ENDLESS_CHUNK_DELAY_S)
    for i in range(n):
        if i == k and fault in (
            "cut",
            "stall",
            "malformed",
            "error_event",
            "no_final",
            "junk_line",
            "garbage_ids",
        ):
            break
        if request.app["token_delay"]:
            await asyncio.sleep(request.app["token_delay"])
        reason = "length" if i == n - 1 else None
        if reason and fault == "abort":
            reason = "abort"
        chunk = {
            "id": "c",
            "object": "text_completion",
            "model": "fault-model",
            "choices": [choice([ids[i]], reason)],
        }
        await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
    else:
        usage = n + 1 if fault == "mismatch" else n
        if body.get("stream_options", {}).get("include_usage"):
            chunk = {
                "id": "c",
                "object": "text_completion",
                "model": "fault-model",
                "choices": [],
                "usage": {"prompt_tokens": 3, "completion_tokens": usage, "total_tokens": 3 + usage},
            }
            await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp
    await asyncio.sleep(0.05)
    if fault == "cut":
        request.transport.close()
    elif fault == "stall":
        await asyncio.sleep(3600)
    elif fault == "malformed":
        await resp.write(b'data: {"choices": [{"token_ids": [1\n\n')
    elif fault == "error_event":
        await resp.write(
            b'data: {"error": {"message": "injected engine error", "type": "InternalError", '
            b'"param": null, "code": 500}}\n\ndata: [DONE]\n\n'
        )
    elif fault == "no_final":
        await resp.write(b"data: [DONE]\n\n")
    elif fault == "junk_line":
        await resp.write(b"<html>502 Bad Gateway</html>\n")
    elif fault == "garbage_ids":
        await resp.write(
            b'data: {"choices":[{"index":0,"text":"x","finish_reason":null,"token_ids":["x"]}]}\n\n'
        )
    return resp

"""The HTTP side of gptoss.serve: request handlers for SGLang's /generate, OpenAI's /v1/completions
and the small endpoints, around one AsyncEngine (Server)."""

from __future__ import annotations

import argparse
import logging
import time
from contextlib import aclosing
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from gptoss.serve.api import (
    ApiError,
    Limits,
    Request,
    completion,
    completion_choice,
    finish_reason,
    meta_info,
    parse_completion,
    parse_generate,
    token_ids,
)
from gptoss.serve.text import TextStream, Tokenizer

log = logging.getLogger("gptoss.serve")
STATE = web.AppKey("state", "Server")
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class Server:
    """What the handlers share: the engine, the limits, and the requests in flight."""

    def __init__(self, engine: Any, args: argparse.Namespace, model_path: Path, vocab_size: int) -> None:
        self.engine = engine
        self.args = args
        self.model_path = model_path
        self.model = args.served_model_name or model_path.name
        self.limits = Limits(vocab_size=vocab_size, max_model_len=engine.max_model_len,
                             stream_interval=args.stream_interval)
        self.incremental = args.incremental_streaming_output
        self.max_in_flight = args.max_num_seqs + args.max_queued_requests
        self.in_flight = 0
        self.draining = False
        self.tokenizer = Tokenizer()
        self.created = int(time.time())

    def admit(self) -> None:
        if self.draining:
            raise ApiError(503, "the server is shutting down", "ServiceUnavailableError")
        if self.in_flight >= self.max_in_flight:
            raise ApiError(503, f"the server is busy: {self.in_flight} requests in flight (limit "
                                f"--max-num-seqs + --max-queued-requests = {self.max_in_flight}); retry later",
                           "ServiceUnavailableError")
        self.in_flight += 1

    def release(self) -> None:
        self.in_flight -= 1


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type="application/json")


def _error(e: ApiError) -> web.Response:
    return _json(e.body(), e.status)


def _event(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


async def _body(request: web.Request) -> Any:
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as e:
        raise ApiError(413, f"request body too large: {e.text}; limit --max-request-bytes", "RequestTooLarge") from None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}") from None


def _submit(server: Server, req: Request):
    """Queue the request in the engine; bad input (duplicate rid, too long) raises here, as a 4xx."""
    try:
        return server.engine.generate(req.prompt, req.params, request_id=req.rid)
    except Exception as e:
        raise _engine_error(e) from None


def _engine_error(e: BaseException) -> ApiError:
    if isinstance(e, ValueError):
        return ApiError(400, str(e))
    log.error("engine error: %s: %s", type(e).__name__, e)
    return ApiError(500, f"engine error: {type(e).__name__}: {e}", "InternalServerError")


# ----------------------------------------------------------------------------- /generate


async def generate(request: web.Request) -> web.StreamResponse:
    server = request.app[STATE]
    try:
        req = parse_generate(await _body(request), server.limits)
        server.admit()
    except ApiError as e:
        return _error(e)
    try:
        gen = _submit(server, req)
        async with aclosing(gen):  # however the handler ends, a running request is aborted
            return await (_generate_stream(request, server, req, gen) if req.stream
                          else _generate_whole(server, req, gen))
    except ApiError as e:
        return _error(e)
    finally:
        server.release()


async def _generate_whole(server: Server, req: Request, gen) -> web.Response:
    started = time.monotonic()
    ids: list[int] = []
    last = None
    try:
        async with aclosing(gen):
            async for d in gen:
                ids += d.token_ids
                last = d
    except Exception as e:
        return _error(_engine_error(e))
    reason = finish_reason(last.finish_reason if last else "abort", last.stop_token_id if last else None, len(ids))
    return _json({"output_ids": ids, "meta_info": meta_info(req, len(ids), reason, started)})


async def _generate_stream(request: web.Request, server: Server, req: Request, gen) -> web.StreamResponse:
    started = time.monotonic()
    ids: list[int] = []
    sent = 0  # ids already in a chunk
    async with aclosing(gen):
        resp = web.StreamResponse(headers=SSE_HEADERS)
        await resp.prepare(request)
        it = aiter(gen)
        while True:
            try:
                d = await anext(it)
            except StopAsyncIteration:
                break
            except Exception as e:  # the engine failed: SGLang's in-stream error shape
                err = _engine_error(e)
                await resp.write(_event({"error": {"message": str(err), "type": err.type, "code": err.status}}))
                break
            ids += d.token_ids
            if d.finish_reason is None and len(ids) - sent < req.stream_interval:
                continue
            reason = finish_reason(d.finish_reason, d.stop_token_id, len(ids))
            out = ids[sent:] if server.incremental else ids
            sent = len(ids)
            # A client that went away makes write() raise: leaving the loop aborts the request.
            await resp.write(_event({"output_ids": out, "meta_info": meta_info(req, len(ids), reason, started)}))
    await resp.write(b"data: [DONE]\n\n")
    return resp


# ----------------------------------------------------------------------------- /v1/completions


async def completions(request: web.Request) -> web.StreamResponse:
    server = request.app[STATE]
    try:
        req = parse_completion(await _body(request), server.limits, server.model, server.tokenizer.encode)
        server.admit()
    except ApiError as e:
        return _error(e)
    try:
        gen = _submit(server, req)
        async with aclosing(gen):
            return await (_completion_stream(request, server, req, gen) if req.stream
                          else _completion_whole(server, req, gen))
    except ApiError as e:
        return _error(e)
    finally:
        server.release()


async def _completion_steps(server: Server, req: Request, gen):
    """(new ids, new text, finish_reason, stop_reason) per engine step; ends early on a stop string."""
    text = TextStream(server.tokenizer, req.stop, req.skip_special_tokens, req.include_stop_str)
    ids: list[int] = []
    async with aclosing(gen):
        async for d in gen:
            ids += d.token_ids
            final = d.finish_reason is not None
            piece = text.step(ids, final)
            if text.stopped is not None:  # leaving the loop aborts the rest of the generation
                yield d.token_ids, piece, "stop", text.stopped
                return
            if d.finish_reason == "abort":
                raise RuntimeError("the engine aborted the request")
            yield d.token_ids, piece, d.finish_reason, d.stop_token_id if d.finish_reason == "stop" else None


async def _completion_whole(server: Server, req: Request, gen) -> web.Response:
    ids: list[int] = []
    text: list[str] = []
    reason = stop_reason = None
    try:
        async with aclosing(_completion_steps(server, req, gen)) as steps:
            async for new, piece, reason, stop_reason in steps:
                ids += new
                text.append(piece)
    except Exception as e:
        return _error(_engine_error(e))
    choice = completion_choice(req, "".join(text), ids, reason, stop_reason, first=True)
    return _json(completion(req, server.model, int(time.time()), [choice], len(ids)))


async def _completion_stream(request: web.Request, server: Server, req: Request, gen) -> web.StreamResponse:
    created = int(time.time())
    n = 0
    first = True
    async with aclosing(_completion_steps(server, req, gen)) as steps:
        resp = web.StreamResponse(headers=SSE_HEADERS)
        await resp.prepare(request)
        it = aiter(steps)
        while True:
            try:
                new, piece, reason, stop_reason = await anext(it)
            except StopAsyncIteration:
                break
            except Exception as e:
                await resp.write(_event(_engine_error(e).body()))
                await resp.write(b"data: [DONE]\n\n")
                return resp
            if not new and not piece and reason is None:
                continue
            n += len(new)
            choice = completion_choice(req, piece, new, reason, stop_reason, first)
            first = False
            await resp.write(_event(completion(req, server.model, created, [choice], None)))
    if req.include_usage:
        await resp.write(_event(completion(req, server.model, created, [], n)))
    await resp.write(b"data: [DONE]\n\n")
    return resp


# ----------------------------------------------------------------------------- small endpoints


async def health(request: web.Request) -> web.Response:
    server = request.app[STATE]
    return web.Response(status=503 if server.draining else 200)


async def models(request: web.Request) -> web.Response:
    s = request.app[STATE]
    return _json({"object": "list", "data": [{"id": s.model, "object": "model", "created": s.created,
                                              "owned_by": "gptoss", "root": str(s.model_path),
                                              "max_model_len": s.limits.max_model_len}]})


async def model_info(request: web.Request) -> web.Response:
    s = request.app[STATE]
    return _json({"model_path": str(s.model_path), "tokenizer_path": None, "is_generation": True})


async def tokenize(request: web.Request) -> web.Response:
    s = request.app[STATE]
    try:
        body = await _body(request)
        prompt = body.get("prompt") if isinstance(body, dict) else None
        if not isinstance(prompt, str):
            raise ApiError(400, "prompt must be a string")
    except ApiError as e:
        return _error(e)
    ids = s.tokenizer.encode(prompt)
    return _json({"count": len(ids), "max_model_len": s.limits.max_model_len, "tokens": ids, "token_strs": None})


async def detokenize(request: web.Request) -> web.Response:
    s = request.app[STATE]
    try:
        body = await _body(request)
        ids = token_ids(body.get("tokens") if isinstance(body, dict) else None, "tokens", s.limits.vocab_size)
    except ApiError as e:
        return _error(e)
    return _json({"prompt": s.tokenizer.decode(ids)})


async def tokenizer_info(request: web.Request) -> web.Response:
    s = request.app[STATE]
    return _json(s.tokenizer.info(s.limits.max_model_len))


def build_app(server: Server) -> web.Application:
    app = web.Application(client_max_size=server.args.max_request_bytes)
    app[STATE] = server
    r = app.router
    r.add_post("/generate", generate)
    r.add_post("/v1/completions", completions)
    r.add_get("/health", health)
    r.add_get("/health_generate", health)
    r.add_get("/v1/models", models)
    r.add_get("/get_model_info", model_info)
    r.add_post("/tokenize", tokenize)
    r.add_post("/detokenize", detokenize)
    r.add_get("/tokenizer_info", tokenizer_info)
    return app

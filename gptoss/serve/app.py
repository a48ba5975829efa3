"""The HTTP side of gptoss.serve: request handlers for SGLang's /generate, OpenAI's /v1/completions
and the small endpoints, around one AsyncEngine (Server). Both generation APIs share one handler
(_handle, _stream); they differ only in how a step is rendered (Generate, Completions)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson
from aiohttp import web

from gptoss.serve.api import ApiError, Limits, Request, token_ids
from gptoss.serve.api_openai import completion, completion_choice, parse_completion
from gptoss.serve.api_sglang import finish_reason, meta_info, parse_generate
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
        self.limits = Limits(
            vocab_size=vocab_size,
            max_model_len=engine.max_model_len,
            stream_interval=args.stream_interval,
            adapters=tuple(engine.adapters()),
        )
        self.incremental = args.incremental_streaming_output
        # Every replica runs --max-num-seqs at once; the queue beyond them is shared.
        self.max_in_flight = args.engine.max_num_seqs * args.engine.num_replicas + args.max_queued_requests
        self.running: set[str] = set()  # request ids with a handler
        self.idle = asyncio.Event()  # set while no request is in flight (the shutdown drain waits on it)
        self.idle.set()
        self.draining = False
        self.abort_message = "aborted by the engine"  # what a cut request is told; set at shutdown
        self.tokenizer = Tokenizer()
        self.created = int(time.time())

    @property
    def in_flight(self) -> int:
        return len(self.running)

    def admit(self, rid: str) -> None:
        if self.draining:
            raise ApiError(503, "the server is shutting down", "ServiceUnavailableError")
        if self.in_flight >= self.max_in_flight:
            raise ApiError(
                503,
                f"the server is busy: {self.in_flight} requests in flight (limit "
                f"--max-num-seqs x replicas + --max-queued-requests = {self.max_in_flight}); retry later",
                "ServiceUnavailableError",
            )
        if rid in self.running:
            raise ApiError(400, f"request id {rid!r} is already in flight")
        self.running.add(rid)
        self.idle.clear()

    def release(self, rid: str) -> None:
        self.running.discard(rid)
        if not self.running:
            self.idle.set()

    def abort_all(self, message: str) -> None:
        """Abort every request in flight: each stream ends with an abort event, then [DONE]."""
        self.abort_message = message
        for rid in list(self.running):
            self.engine.abort(rid)


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type="application/json")


def _error(e: ApiError) -> web.Response:
    return _json(e.body(), e.status)


def _event(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


DONE = b"data: [DONE]\n\n"


async def _body(request: web.Request) -> Any:
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as e:
        raise ApiError(
            413, f"request body too large: {e.text}; limit --max-request-bytes", "RequestTooLarge"
        ) from None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}") from None


def _engine_error(e: BaseException) -> ApiError:
    if isinstance(e, ValueError):
        return ApiError(400, str(e))
    log.error("engine error: %s: %s", type(e).__name__, e)
    return ApiError(500, f"engine error: {type(e).__name__}: {e}", "InternalServerError")


# ----------------------------------------------------------------------------- one request, either API


@dataclass(slots=True)
class Step:
    """What one engine step added to a request."""

    new: list[int]
    text: str  # completions only: the new text (a stop string may end it early)
    finish: str | None  # None while running; "stop" | "length" | "abort"
    stop: int | str | None  # the matched stop token id, or stop string


@dataclass(slots=True)
class Reply:
    """What a request has produced so far."""

    ids: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    sent: int = 0  # ids already in a /generate chunk
    started: float = field(default_factory=time.monotonic)
    created: int = field(default_factory=lambda: int(time.time()))
    last: Step | None = None

    def add(self, step: Step) -> None:
        self.ids += step.new
        self.text.append(step.text)
        self.last = step


async def _steps(server: Server, req: Request, gen) -> AsyncIterator[Step]:
    """The engine's deltas as Steps; for completions also text, ending early on a stop string."""
    text = (
        TextStream(server.tokenizer, req.stop, req.skip_special_tokens, req.include_stop_str)
        if req.api == "completions"
        else None
    )
    ids: list[int] = []
    async with aclosing(gen):
        async for d in gen:
            ids += d.token_ids
            piece = text.step(ids, d.finish_reason is not None) if text is not None else ""
            if text is not None and text.stopped is not None:  # leaving the loop aborts the rest
                yield Step(d.token_ids, piece, "stop", text.stopped)
                return
            yield Step(
                d.token_ids, piece, d.finish_reason, d.stop_token_id if d.finish_reason == "stop" else None
            )


class Api(Protocol):
    """How one API renders a request's steps."""

    def chunk(self, server: Server, req: Request, reply: Reply, step: Step) -> dict | None: ...
    def whole(self, server: Server, req: Request, reply: Reply) -> dict: ...
    def tail(self, server: Server, req: Request, reply: Reply) -> list[dict]: ...


class Generate:
    """SGLang's /generate: output_ids (cumulative unless incremental) and meta_info per chunk."""

    @staticmethod
    def _finish(server: Server, step: Step | None, n: int) -> dict | None:
        if step is None:
            return finish_reason("abort", None, n, server.abort_message)
        return finish_reason(step.finish, step.stop, n, server.abort_message)

    def chunk(self, server: Server, req: Request, reply: Reply, step: Step) -> dict | None:
        if step.finish is None and len(reply.ids) - reply.sent < req.stream_interval:
            return None
        out = reply.ids[reply.sent :] if server.incremental else reply.ids
        reply.sent = len(reply.ids)
        reason = self._finish(server, step, len(reply.ids))
        return {"output_ids": out, "meta_info": meta_info(req, len(reply.ids), reason, reply.started)}

    def whole(self, server: Server, req: Request, reply: Reply) -> dict:
        reason = self._finish(server, reply.last, len(reply.ids))
        return {"output_ids": reply.ids, "meta_info": meta_info(req, len(reply.ids), reason, reply.started)}

    def tail(self, server: Server, req: Request, reply: Reply) -> list[dict]:
        return []


class Completions:
    """OpenAI's /v1/completions: text, token_ids (return_token_ids), usage (include_usage)."""

    @staticmethod
    def _finish(server: Server, step: Step | None) -> tuple[str, Any]:
        if step is None or step.finish == "abort":
            return "abort", server.abort_message
        return step.finish, step.stop

    def chunk(self, server: Server, req: Request, reply: Reply, step: Step) -> dict | None:
        if not step.new and not step.text and step.finish is None:
            return None
        reason, stop = self._finish(server, step) if step.finish is not None else (None, None)
        choice = completion_choice(req, step.text, step.new, reason, stop, first=reply.sent == 0)
        reply.sent = len(reply.ids)
        return completion(req, server.model, reply.created, [choice], None)

    def whole(self, server: Server, req: Request, reply: Reply) -> dict:
        reason, stop = self._finish(server, reply.last)
        choice = completion_choice(req, "".join(reply.text), reply.ids, reason, stop, first=True)
        return completion(req, server.model, reply.created, [choice], len(reply.ids))

    def tail(self, server: Server, req: Request, reply: Reply) -> list[dict]:
        return [completion(req, server.model, reply.created, [], len(reply.ids))] if req.include_usage else []


async def _handle(
    request: web.Request, parse: Callable[[Server, Any], Request], api: Api
) -> web.StreamResponse:
    server = request.app[STATE]
    try:
        req = parse(server, await _body(request))
        server.admit(req.rid)
    except ApiError as e:
        return _error(e)
    try:
        try:
            gen = server.engine.generate(req.prompt, req.params, request_id=req.rid, lora=req.lora)
        except Exception as e:  # noqa: BLE001
            # bad input the engine found (too long ...): a 4xx before any reply
            return _error(_engine_error(e))
        # aclosing: however the handler ends (client gone, cancelled), a running request is aborted.
        async with aclosing(_steps(server, req, gen)) as steps:
            if req.stream:
                return await _stream(request, server, req, steps, api)
            reply = Reply()
            try:
                async for step in steps:
                    reply.add(step)
            except Exception as e:  # noqa: BLE001 - the client gets it: a 400, or a 500 that is logged
                return _error(_engine_error(e))
            return _json(api.whole(server, req, reply))
    finally:
        server.release(req.rid)


async def _stream(
    request: web.Request, server: Server, req: Request, steps: AsyncIterator[Step], api: Api
) -> web.StreamResponse:
    """SSE: a chunk per step (as the API renders it), its tail, then [DONE]; an engine failure
    mid-stream is an error event before [DONE]. A client that went away makes write() raise."""
    reply = Reply()
    resp = web.StreamResponse(headers=SSE_HEADERS)
    await resp.prepare(request)
    while True:
        try:
            step = await anext(steps)
        except StopAsyncIteration:
            break
        except Exception as e:  # noqa: BLE001 - the client gets it as an error event
            await resp.write(_event(_engine_error(e).body()))
            await resp.write(DONE)
            return resp
        reply.add(step)
        if (event := api.chunk(server, req, reply, step)) is not None:
            await resp.write(_event(event))
    for event in api.tail(server, req, reply):
        await resp.write(_event(event))
    await resp.write(DONE)
    return resp


async def generate(request: web.Request) -> web.StreamResponse:
    return await _handle(request, lambda s, body: parse_generate(body, s.limits), GENERATE)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _handle(
        request, lambda s, body: parse_completion(body, s.limits, s.model, s.tokenizer.encode), COMPLETIONS
    )


GENERATE, COMPLETIONS = Generate(), Completions()


# ----------------------------------------------------------------------------- small endpoints


async def health(request: web.Request) -> web.Response:
    server = request.app[STATE]
    return web.Response(status=503 if server.draining else 200)


async def models(request: web.Request) -> web.Response:
    """The base model, then each LoRA adapter with the base as its parent (as vLLM lists them)."""
    s = request.app[STATE]
    base = {
        "id": s.model,
        "object": "model",
        "created": s.created,
        "owned_by": "gptoss",
        "root": str(s.model_path),
        "parent": None,
        "max_model_len": s.limits.max_model_len,
    }
    loras = [
        base | {"id": name, "root": path, "parent": s.model} for name, path in s.engine.adapters().items()
    ]
    return _json({"object": "list", "data": [base, *loras]})


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
    return _json(
        {"count": len(ids), "max_model_len": s.limits.max_model_len, "tokens": ids, "token_strs": None}
    )


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

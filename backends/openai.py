"""--backend openai: any OpenAI-compatible POST /v1/completions with a token-id prompt.

Token ids come back through `return_token_ids` (vLLM >= 0.10.2, and python -m gptoss.serve): each
streamed choice carries the new ids in `token_ids`, and a final chunk carries `usage`
(stream_options.include_usage) whose completion_tokens must match the ids received. A server that
sends text without ids is refused: ids are never guessed from text.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from backends.base import RunSpec, SamplingParams
from backends.http import (
    HttpClient,
    HttpOptions,
    MalformedReplyError,
    ServerReportedError,
    StreamBrokenError,
    TokenCountError,
)
from backends.sse import data_payloads

DEFAULT_URL = "http://127.0.0.1:8000"  # vllm serve's default port


@dataclass(frozen=True, slots=True)
class OpenAIOptions(HttpOptions):
    openai_model: str | None = field(
        default=None,
        metadata={
            "help": "the `model` field of requests",
            "metavar": "NAME",
            "default_help": "the one model GET /v1/models lists",
        },
    )


def _loads(buf: bytes, s: int, e: int, url: str) -> Any:
    import orjson

    try:
        obj = orjson.loads(memoryview(buf)[s:e])
    except orjson.JSONDecodeError as err:
        raise MalformedReplyError(
            f"{url} sent malformed JSON ({err}): {buf[s : min(e, s + 120)]!r}"
        ) from None
    if not isinstance(obj, dict):
        raise MalformedReplyError(f"{url} sent a reply that is not a JSON object")
    if "error" in obj:
        err = obj["error"]
        raise ServerReportedError(
            f"{url} reported an error: {err.get('message', err) if isinstance(err, dict) else err}"
        )
    return obj


def _choice(obj: dict, url: str) -> tuple[list[int], str | None] | None:
    choices = obj.get("choices")
    if not choices:
        return None
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise MalformedReplyError(f"{url} sent {choices!r:.200} where one choice was expected")
    c = choices[0]
    ids = c.get("token_ids")
    if ids is None:
        if c.get("text"):
            raise MalformedReplyError(
                f"{url} sent text without token_ids: the server must support `return_token_ids` "
                "(vLLM >= 0.10.2 or python -m gptoss.serve)"
            )
        ids = []
    if not isinstance(ids, list) or not all(type(x) is int for x in ids):
        raise MalformedReplyError(f"{url} sent non-integer token_ids")
    reason = c.get("finish_reason")
    if reason is not None and reason not in ("stop", "length"):
        detail = f": {c['stop_reason']}" if c.get("stop_reason") else ""
        raise ServerReportedError(f"{url} finished the request with finish_reason={reason!r}{detail}")
    return ids, reason


def _usage_count(obj: dict, url: str) -> int | None:
    usage = obj.get("usage")
    if usage is None:
        return None
    count = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if type(count) is not int:
        raise MalformedReplyError(f"{url} sent usage without an integer completion_tokens")
    return count


class OpenAIDecoder:
    """Streamed completion chunks (delta token_ids) -> new ids; checks usage.completion_tokens."""

    __slots__ = ("url", "count", "new", "finished", "_done")

    def __init__(self, url: str) -> None:
        self.url = url
        self.count = 0
        self.new: list[int] = []
        self.finished = False
        self._done = False

    def take(self) -> list[int]:
        new = self.new
        if new:
            self.new = []
        return new

    def feed_block(self, buf: bytes, a: int, b: int) -> None:
        for s, e in data_payloads(buf, a, b, self.url):
            self._event(buf, s, e)

    def _event(self, buf: bytes, s: int, e: int) -> None:
        if buf.startswith(b"[DONE]", s):
            if not self.finished:
                raise StreamBrokenError(
                    f"{self.url} ended the stream ([DONE]) after {self.count} tokens without a finish_reason"
                )
            self._done = True
            return
        if self._done:
            raise MalformedReplyError(f"{self.url} sent data after [DONE]")
        obj = _loads(buf, s, e, self.url)
        choice = _choice(obj, self.url)
        if choice is not None:
            ids, reason = choice
            if self.finished and ids:
                raise MalformedReplyError(f"{self.url} sent token ids after the finish_reason")
            self.count += len(ids)
            self.new += ids
            if reason is not None:
                if not self.count:
                    raise MalformedReplyError(f"{self.url} finished the request without any token")
                self.finished = True
        count = _usage_count(obj, self.url)
        if count is not None and count != self.count:
            raise TokenCountError(
                f"{self.url} reported completion_tokens={count} but streamed {self.count} token ids"
            )


def parse_whole(body: bytes, url: str) -> list[int]:
    obj = _loads(body, 0, len(body), url)
    choice = _choice(obj, url)
    if choice is None:
        raise MalformedReplyError(f"{url} sent a completion without choices")
    ids, reason = choice
    if reason is None:
        raise MalformedReplyError(f"{url} sent a non-streamed completion without a finish_reason")
    count = _usage_count(obj, url)
    if count is not None and count != len(ids):
        raise TokenCountError(f"{url} reported completion_tokens={count} but sent {len(ids)} token ids")
    if not ids:
        raise MalformedReplyError(f"{url} finished the request without any token")
    return ids


def request_fields(p: SamplingParams) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "max_tokens": p.max_new_tokens,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "ignore_eos": p.ignore_eos,
        "stop_token_ids": [] if p.ignore_eos else list(p.stop_token_ids),
        "return_token_ids": True,
    }
    if p.top_k > 0:  # omitted = disabled on every server
        fields["top_k"] = p.top_k
    if p.seed is not None:
        fields["seed"] = p.seed
    return fields


class OpenAIBackend:
    name: ClassVar[str] = "openai"
    in_process: ClassVar[bool] = False
    Options: ClassVar[type] = OpenAIOptions
    max_model_len = None  # the server checks its own context
    vocab_size = None

    def __init__(
        self, cfg: RunSpec, fields: Callable[[SamplingParams], dict[str, Any]] = request_fields
    ) -> None:
        """`fields`: a request's sampling fields (--vllm-process server sends vLLM's own)."""
        self.opts: OpenAIOptions = cfg.backend_options or OpenAIOptions()
        self._fields = fields
        urls = tuple(u.rstrip("/").removesuffix("/v1") for u in cfg.server_urls)
        self.client = HttpClient("openai", urls, DEFAULT_URL, self.opts, cfg.max_concurrency, cfg.timeout_s)
        self.model = self.opts.openai_model
        self._encoded: dict[SamplingParams, bytes] = {}

    @classmethod
    def default_model_path(cls) -> Path | None:
        return None  # the server loads the model

    async def __aenter__(self) -> OpenAIBackend:
        await self.client.__aenter__()
        try:
            if self.model is None:
                self.model = await self._only_model()
        except BaseException:
            await self.client.__aexit__()
            raise
        return self

    async def _only_model(self) -> str:
        listing = await self.client.get_json("/v1/models")
        data = listing.get("data") if isinstance(listing, dict) else None
        names = [m.get("id") for m in data or [] if isinstance(m, dict)]
        if len(names) != 1 or not isinstance(names[0], str):
            raise MalformedReplyError(
                f"GET /v1/models on {self.client.pool.servers[0].url} lists {names}; "
                "pick one with --openai-model"
            )
        return names[0]

    async def __aexit__(self, *exc: object) -> None:
        await self.client.__aexit__(*exc)

    def stream(self, prompt: list[int], params: SamplingParams):
        import orjson

        tail = self._encoded.get(params)
        if tail is None:
            fields = {"model": self.model, **self._fields(params), "stream": self.opts.stream}
            if self.opts.stream:
                fields["stream_options"] = {"include_usage": True}
            tail = self._encoded[params] = b"," + orjson.dumps(fields)[1:]
        body = b'{"prompt":' + orjson.dumps(prompt) + tail
        return self.client.request(
            "/v1/completions", body, OpenAIDecoder, self.opts.stream, parse_whole, params.max_new_tokens
        )

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "api": "OpenAI POST /v1/completions with a token-id prompt",
            "model": self.model,
            **self.client.describe(),
        }


def create(cfg: RunSpec) -> OpenAIBackend:
    return OpenAIBackend(cfg)

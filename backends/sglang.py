"""--backend sglang: SGLang's native POST /generate with token ids, streamed over SSE.

SGLang streams cumulative output_ids by default: chunk k repeats all k ids. Parsing every chunk
whole is O(n^2) per request and is what makes the reference client slow. This decoder reads
meta_info.completion_tokens from the end of the chunk and only the new tail of output_ids, so a
chunk costs O(new ids) in Python, and it checks the whole list once, on the final chunk.
"""

from __future__ import annotations

import re
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
from backends.sse import SSE_FIELDS, data_payloads

DEFAULT_URL = "http://127.0.0.1:30000"  # SGLang's default port


@dataclass(frozen=True, slots=True)
class SglangOptions(HttpOptions):
    stream_interval: int | None = field(
        default=None,
        metadata={
            "help": "ask the server for one SSE chunk per N tokens",
            "metavar": "N",
            "default_help": "the server's",
        },
    )

    def __post_init__(self) -> None:
        HttpOptions.__post_init__(self)  # explicit: zero-argument super() fails in slotted dataclasses
        if self.stream_interval is not None and self.stream_interval < 1:
            raise ValueError(f"stream_interval must be >= 1, got {self.stream_interval}")


_UNKNOWN, _CUMULATIVE, _INCREMENTAL = 0, 1, 2
_INT = re.compile(rb"\d+")
_LIST_END = b'],"meta_info":{'  # orjson (SGLang) writes output_ids right before meta_info
_KEY = b'"output_ids":['


class SglangDecoder:
    """SSE payloads of one /generate stream -> new token ids. Handles cumulative and incremental ids."""

    __slots__ = ("url", "ids", "new", "finished", "mode")

    def __init__(self, url: str) -> None:
        self.url = url
        self.ids: list[int] = []  # everything received, for the final check
        self.new: list[int] = []  # received since the last take()
        self.finished = False
        self.mode = _UNKNOWN

    def take(self) -> list[int]:
        new = self.new
        if new:
            self.new = []
        return new

    def feed_block(self, buf: bytes, a: int, b: int) -> None:
        if self.mode == _CUMULATIVE:
            self._newest(buf, a, b)
            return
        if buf.startswith(b"data: {", a) and buf.find(b"\n", a, b) == b - 2 and buf[b - 1] == 10:
            self._event(buf, a + 6, b - 2)  # the block is one chunk: what a paced stream reads
            return
        for s, e in data_payloads(buf, a, b, self.url):
            if buf.startswith(b"[DONE]", s):
                self._done()
                continue
            self._event(buf, s, e)
            if self.mode == _CUMULATIVE:  # just learned: skip to the newest chunk of this block
                self.feed_block(buf, buf.find(b"\n", e) + 1, b)
                return

    def _newest(self, buf: bytes, a: int, b: int) -> None:
        """Cumulative ids: of the chunks that arrived together only the newest matters, so lines are
        walked backwards (memrchr) until it is found; the ones before it are never looked at.
        An error event, a [DONE] or a bad line after it is acted on once its ids are taken."""
        done = False
        error: tuple[int, int] | None = None
        junk: MalformedReplyError | None = None
        j = b - 1  # a newline
        while j >= a:
            i = buf.rfind(b"\n", a, j) + 1 or a
            stop = j - 1 if j > i and buf[j - 1] == 13 else j
            if stop > i:
                if buf.startswith(b"data:", i):
                    s = i + 6 if buf.startswith(b" ", i + 5) else i + 5
                    if buf.startswith(b"[DONE]", s):
                        done = True
                    elif buf.startswith(b'{"error"', s):
                        error = error or (s, stop)
                    else:
                        self._event(buf, s, stop)
                        break
                elif not buf.startswith(SSE_FIELDS, i):
                    junk = junk or MalformedReplyError(
                        f"malformed SSE line from {self.url}: {buf[i : min(stop, i + 200)]!r}"
                    )
            j = i - 1
        if error is not None:
            self._whole(_loads(buf, *error, self.url))
        if junk is not None:
            raise junk
        if done:
            self._done()

    def _done(self) -> None:
        if not self.finished:
            raise StreamBrokenError(
                f"{self.url} ended the stream ([DONE]) after {len(self.ids)} tokens without a final chunk"
            )

    def _event(self, buf: bytes, s: int, e: int) -> None:
        if self.finished:
            raise MalformedReplyError(f"{self.url} sent data after the final chunk")
        # Fast path for a long unfinished chunk in SGLang's compact layout (a short one parses whole
        # as fast): everything needed sits at the end, meta_info and the tail of output_ids before it.
        if e - s > 512 and buf.rfind(b'"finish_reason":null', s, e) >= 0:
            le = buf.rfind(_LIST_END, s, e)
            ci = buf.rfind(b'"completion_tokens":', s, e)
            if 0 <= le < ci:
                m = _INT.match(buf, ci + 20)
                if m is not None:
                    self._tail(buf, s, le, int(m.group()))
                    return
        self._whole(_loads(buf, s, e, self.url))

    def _tail(self, buf: bytes, s: int, le: int, count: int) -> None:
        have = len(self.ids)
        new = count - have
        if new <= 0:
            if new < 0:
                raise TokenCountError(f"{self.url} lowered completion_tokens from {have} to {count}")
            return
        t = le
        for _ in range(new):
            t = buf.rfind(b",", s, t)
            if t < 0:
                t = s - 1
                break
        seg = buf[t + 1 : le]
        b = seg.rfind(b"[")
        if b >= 0:  # the whole list is in seg: it holds `new` ids or fewer
            if not seg.endswith(_KEY, 0, b + 1):
                raise MalformedReplyError(f"{self.url} sent a chunk whose ids are not in output_ids")
            if have and self.mode == _CUMULATIVE:
                raise TokenCountError(f"{self.url} switched from cumulative to incremental output_ids")
            if have:
                self.mode = _INCREMENTAL
            seg = seg[b + 1 :]
        else:  # more ids precede the tail: cumulative
            if self.mode == _INCREMENTAL or not have:
                raise TokenCountError(
                    f"{self.url} sent more output_ids than completion_tokens={count} allows after {have}"
                )
            self.mode = _CUMULATIVE
        try:
            ids = [int(x) for x in seg.split(b",")] if new > 1 else [int(seg)]
        except ValueError:
            raise MalformedReplyError(f"{self.url} sent non-integer output_ids: {seg[:80]!r}") from None
        if len(ids) != new:
            raise TokenCountError(
                f"{self.url} sent {len(ids)} new output_ids but completion_tokens grew by {new}"
            )
        self.ids += ids
        self.new += ids

    def _whole(self, obj: Any) -> None:
        """A chunk parsed whole: the final one, an error, or a layout the fast path does not know."""
        if not isinstance(obj, dict):
            raise MalformedReplyError(f"{self.url} sent a chunk that is not a JSON object")
        if "error" in obj:
            raise ServerReportedError(f"{self.url} reported an error: {_message(obj['error'])}")
        ids, count, reason = _fields(obj, self.url)
        have = len(self.ids)
        if count < have:
            raise TokenCountError(f"{self.url} lowered completion_tokens from {have} to {count}")
        # With `have` ids already taken the two modes differ in length (count vs count - have).
        if len(ids) == count and self.mode != _INCREMENTAL and ids[:have] == self.ids:
            new = ids[have:]
            if have:
                self.mode = _CUMULATIVE
        elif len(ids) == count - have and self.mode != _CUMULATIVE:
            new = ids
            if have:
                self.mode = _INCREMENTAL
        else:
            raise TokenCountError(
                f"{self.url} sent {len(ids)} output_ids with completion_tokens={count} after streaming "
                f"{have}: they disagree with the count or with the ids already streamed"
            )
        self.ids += new
        self.new += new
        if reason is not None:
            _check_finish(reason, self.url)
            if not self.ids:
                raise MalformedReplyError(f"{self.url} finished the request without any token")
            self.finished = True


def _loads(buf: bytes, s: int, e: int, url: str) -> Any:
    import orjson

    try:
        return orjson.loads(memoryview(buf)[s:e])
    except orjson.JSONDecodeError as err:
        raise MalformedReplyError(
            f"{url} sent malformed JSON ({err}): {buf[s : min(e, s + 120)]!r}"
        ) from None


def _message(err: Any) -> str:
    return str(err.get("message", err)) if isinstance(err, dict) else str(err)


def _fields(obj: dict, url: str) -> tuple[list[int], int, Any]:
    ids, meta = obj.get("output_ids"), obj.get("meta_info")
    if not isinstance(ids, list) or not isinstance(meta, dict):
        raise MalformedReplyError(f"{url} sent a reply without output_ids and meta_info: {str(obj)[:200]}")
    count = meta.get("completion_tokens")
    if type(count) is not int:
        raise MalformedReplyError(f"{url} sent meta_info without an integer completion_tokens")
    if not all(type(x) is int for x in ids):
        raise MalformedReplyError(f"{url} sent non-integer output_ids")
    return ids, count, meta.get("finish_reason")


def _check_finish(reason: Any, url: str) -> None:
    kind = reason.get("type") if isinstance(reason, dict) else reason
    if kind == "abort":
        raise ServerReportedError(f"{url} aborted the request: {_message(reason)}")
    if kind not in ("stop", "length"):
        raise MalformedReplyError(f"{url} sent an unknown finish_reason {reason!r}")


def parse_whole(body: bytes, url: str) -> list[int]:
    """A non-streamed /generate reply -> its output ids."""
    obj = _loads(body, 0, len(body), url)
    if not isinstance(obj, dict):
        raise MalformedReplyError(f"{url} sent a reply that is not a JSON object")
    if "error" in obj:
        raise ServerReportedError(f"{url} reported an error: {_message(obj['error'])}")
    ids, count, reason = _fields(obj, url)
    if len(ids) != count:
        raise TokenCountError(f"{url} sent {len(ids)} output_ids but completion_tokens={count}")
    if reason is None:
        raise MalformedReplyError(f"{url} sent a non-streamed reply without a finish_reason")
    _check_finish(reason, url)
    if not ids:
        raise MalformedReplyError(f"{url} finished the request without any token")
    return ids


def sampling_params(p: SamplingParams, stream_interval: int | None) -> dict[str, Any]:
    sp: dict[str, Any] = {
        "max_new_tokens": p.max_new_tokens,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "top_k": p.top_k if p.top_k > 0 else -1,  # SGLang: -1 disables
        "ignore_eos": p.ignore_eos,
        # ignore_eos means "never stop early" here, as in the gptoss engine.
        "stop_token_ids": [] if p.ignore_eos else list(p.stop_token_ids),
    }
    if p.seed is not None:
        sp["sampling_seed"] = p.seed
    if stream_interval is not None:
        sp["stream_interval"] = stream_interval
    return sp


class SglangBackend:
    name: ClassVar[str] = "sglang"
    in_process: ClassVar[bool] = False
    Options: ClassVar[type] = SglangOptions
    max_model_len = None  # the server checks its own context
    vocab_size = None

    def __init__(self, cfg: RunSpec) -> None:
        self.opts: SglangOptions = cfg.backend_options or SglangOptions()
        self.client = HttpClient(
            "sglang", cfg.server_urls, DEFAULT_URL, self.opts, cfg.max_concurrency, cfg.timeout_s
        )
        self._encoded: dict[SamplingParams, bytes] = {}

    @classmethod
    def default_model_path(cls) -> Path | None:
        return None  # the server loads the model

    async def __aenter__(self) -> SglangBackend:
        await self.client.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.__aexit__(*exc)

    def stream(self, prompt: list[int], params: SamplingParams):
        import orjson

        tail = self._encoded.get(params)
        if tail is None:
            tail = self._encoded[params] = (
                b',"sampling_params":'
                + orjson.dumps(sampling_params(params, self.opts.stream_interval))
                + (b',"stream":true}' if self.opts.stream else b',"stream":false}')
            )
        body = b'{"input_ids":' + orjson.dumps(prompt) + tail
        return self.client.request(
            "/generate", body, SglangDecoder, self.opts.stream, parse_whole, params.max_new_tokens
        )

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "api": "SGLang native POST /generate with input_ids",
            "stream_interval": self.opts.stream_interval,
            **self.client.describe(),
        }


def create(cfg: RunSpec) -> SglangBackend:
    return SglangBackend(cfg)

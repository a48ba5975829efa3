"""SSE framing and the SGLang decoder on exact byte streams, split at every possible point."""

from __future__ import annotations

import asyncio

import orjson
import pytest

import backends.sglang as sglang
from backends.http import MalformedReplyError, TokenCountError
from backends.openai import OpenAIDecoder
from backends.sse import sse_tokens


def sglang_stream(ids: list[int], incremental: bool, interval: int = 1, text: bool = False) -> bytes:
    """The bytes SGLang writes: orjson chunks, meta_info last, cumulative unless incremental."""
    out = []
    for start in range(0, len(ids), interval):
        upto = min(start + interval, len(ids))
        done = upto == len(ids)
        meta = {
            "id": "r1",
            "finish_reason": {"type": "length", "length": len(ids)} if done else None,
            "prompt_tokens": 5,
            "completion_tokens": upto,
            "cached_tokens": 0,
        }
        chunk = {"output_ids": ids[start:upto] if incremental else ids[:upto], "meta_info": meta}
        if text:  # a text field that looks like the keys the fast path searches for
            chunk = {"text": 'a,b]"output_ids":[7', **chunk}
        out.append(b"data: " + orjson.dumps(chunk) + b"\n\n")
    return b"".join(out) + b"data: [DONE]\n\n"


class _Content:
    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = list(pieces)

    async def readany(self) -> bytes:
        return self.pieces.pop(0) if self.pieces else b""


class _Resp:
    """Only the body: the framing loop reads resp.content.readany(), nothing else."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.content = _Content(pieces)


def decode(pieces: list[bytes], decoder) -> list[list[int]]:
    return decode_many([(pieces, decoder)])[0]


def decode_many(cases: list[tuple[list[bytes], object]]) -> list[list[list[int]]]:
    async def one(pieces, decoder):
        return [ids async for ids in sse_tokens(_Resp(pieces), decoder, "http://test", None)]

    async def main():
        return [await one(p, d) for p, d in cases]

    return asyncio.run(main())


IDS = [200005, 17, 0, 99999, 3, 200002, 12, 201087, 5, 6, 7]


@pytest.mark.parametrize("incremental", [False, True])
@pytest.mark.parametrize("text", [False, True])
def test_every_split_point_gives_the_same_ids(incremental, text):
    body = sglang_stream(IDS, incremental, text=text)
    cases = [([body[:cut], body[cut:]], sglang.SglangDecoder("http://test")) for cut in range(1, len(body))]
    for (_, dec), got in zip(cases, decode_many(cases), strict=True):
        assert sum(got, []) == IDS and dec.finished


@pytest.mark.parametrize("incremental", [False, True])
def test_stream_interval_chunks_of_several_ids(incremental):
    ids = list(range(1000, 1037))
    body = sglang_stream(ids, incremental, interval=5)
    dec = sglang.SglangDecoder("http://test")
    assert sum(decode([body[i : i + 7] for i in range(0, len(body), 7)], dec), []) == ids


def test_cumulative_chunks_are_not_parsed_whole(monkeypatch):
    """O(n) per request: a long chunk never goes through the JSON parser, except the final one."""
    parsed = []
    real = sglang._loads
    monkeypatch.setattr(sglang, "_loads", lambda buf, s, e, url: parsed.append(e - s) or real(buf, s, e, url))
    ids = list(range(5000))
    body = sglang_stream(ids, incremental=False)
    chunks = [c + b"\n\n" for c in body.split(b"\n\n") if c]
    for pieces in ([body], chunks):  # all at once (only the newest chunk is read), one chunk per read
        parsed.clear()
        assert sum(decode(pieces, sglang.SglangDecoder("http://test")), []) == ids
        assert max(parsed[:-1]) <= 512 and parsed[-1] > 20_000  # short chunks, then the final one
        assert len(parsed) <= 3 or len(pieces) > 1


def test_final_chunk_that_rewrites_history_is_caught():
    body = sglang_stream([1, 2, 3], incremental=False)
    body = body.replace(b'"output_ids":[1,2,3]', b'"output_ids":[1,9,3]')
    with pytest.raises(TokenCountError, match="disagree"):
        decode([body], sglang.SglangDecoder("http://test"))


def test_more_ids_than_count_is_an_error():
    chunk = (
        b'data: {"output_ids":[1,2,3],"meta_info":{"id":"x","finish_reason":null,"completion_tokens":2}}\n\n'
    )
    with pytest.raises(TokenCountError, match="3 output_ids with completion_tokens=2"):
        decode([chunk], sglang.SglangDecoder("http://test"))


def test_fewer_ids_than_count_is_an_error():
    chunk = b'data: {"output_ids":[1],"meta_info":{"id":"x","finish_reason":null,"completion_tokens":3}}\n\n'
    with pytest.raises((TokenCountError, MalformedReplyError)):
        decode([chunk], sglang.SglangDecoder("http://test"))


def test_spaced_json_falls_back_to_full_parsing():
    chunks = [json_chunk(ids, done) for ids, done in (([4], False), ([4, 5], False), ([4, 5, 6], True))]
    assert sum(decode([b"".join(chunks)], sglang.SglangDecoder("http://test")), []) == [4, 5, 6]


def json_chunk(ids: list[int], done: bool) -> bytes:
    import json

    meta = {
        "finish_reason": {"type": "stop", "matched": ids[-1]} if done else None,
        "completion_tokens": len(ids),
    }
    return b"data: " + json.dumps({"output_ids": ids, "meta_info": meta}).encode() + b"\r\n\r\n"


def test_openai_deltas_and_usage():
    chunks = [
        {"choices": [{"index": 0, "text": "a", "token_ids": [i], "finish_reason": None}]} for i in (7, 8)
    ]
    chunks.append({"choices": [{"index": 0, "text": "", "token_ids": [9], "finish_reason": "stop"}]})
    chunks.append({"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}})
    body = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    cases = [([body[:cut], body[cut:]], OpenAIDecoder("http://test")) for cut in range(1, len(body))]
    for (_, dec), got in zip(cases, decode_many(cases), strict=True):
        assert sum(got, []) == [7, 8, 9] and dec.finished

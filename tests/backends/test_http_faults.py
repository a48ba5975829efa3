"""The sglang and openai clients against a real fault-injection server process on 127.0.0.1.

In every fault the request raises a named BackendError carrying the server's words, only ids the
server sent are yielded (a prefix of TOKEN_BASE + i), and nothing hangs.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import pytest

from backends.base import BackendError
from backends.http import (
    MalformedReplyError,
    ServerHTTPError,
    ServerReportedError,
    ServerTimeoutError,
    StreamBrokenError,
    TokenCountError,
    TokenLimitExceededError,
)
from harness.config import SamplingParams
from tests.backends.fault_handlers import before_fault, sent_ids
from tests.backends.httpkit import (
    BOTH,
    FAULT_SERVER,
    PARAMS,
    N,
    collect,
    get_json,
    make_backend,
    run_one,
    start_process,
    stop_process,
)

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("name", BOTH)
@pytest.mark.parametrize("stream", [True, False])
def test_healthy_server_gives_exactly_the_sent_ids(name, stream, fault_url):
    got, err = asyncio.run(run_one(name, f"{fault_url}/ok", stream=stream))
    assert err is None
    assert got == sent_ids(N)


def test_sglang_incremental_output_gives_the_same_ids(fault_url_incremental):
    got, err = asyncio.run(
        run_one("sglang", f"{fault_url_incremental}/ok", SamplingParams(max_new_tokens=300))
    )
    assert err is None
    assert got == sent_ids(300)


# fault: (sglang error, message part), (openai error, message part); None: an SGLang-only wire fault
# (OpenAI's count comes once, in usage).
MID_STREAM = {
    "cut": ((StreamBrokenError, "lost mid-stream"), (StreamBrokenError, "lost mid-stream")),
    "malformed": ((MalformedReplyError, "malformed JSON"), (MalformedReplyError, "malformed JSON")),
    "error_event": (
        (ServerReportedError, "injected engine error"),
        (ServerReportedError, "injected engine error"),
    ),
    "no_final": (
        (StreamBrokenError, "without a final chunk"),
        (StreamBrokenError, "without a finish_reason"),
    ),
    "lower_count": ((TokenCountError, "lowered completion_tokens from 4 to 2"), None),
    "junk_line": ((MalformedReplyError, "malformed SSE line"), (MalformedReplyError, "malformed SSE line")),
    "garbage_ids": (
        (MalformedReplyError, "non-integer output_ids"),
        (MalformedReplyError, "non-integer token_ids"),
    ),
}


@pytest.mark.parametrize(
    "name, fault",
    [
        (name, fault)
        for fault in sorted(MID_STREAM)
        for i, name in enumerate(BOTH)
        if MID_STREAM[fault][i] is not None
    ],
)
def test_mid_stream_fault_raises_named_error_after_only_sent_ids(name, fault, fault_url):
    cls, text = MID_STREAM[fault][BOTH.index(name)]
    got, err = asyncio.run(run_one(name, f"{fault_url}/{fault}"))
    assert isinstance(err, cls) and isinstance(err, BackendError), repr(err)
    assert text in str(err) and fault_url in str(err)
    assert got == sent_ids(N)[: before_fault(N)]


@pytest.mark.parametrize("name", BOTH)
def test_http_500_carries_the_servers_message(name, fault_url):
    got, err = asyncio.run(run_one(name, f"{fault_url}/http500"))
    assert isinstance(err, ServerHTTPError) and err.status == 500 and err.kind == "http_status"
    assert "HTTP 500" in str(err) and "injected failure: out of memory" in str(err)
    assert got == []


@pytest.mark.parametrize("name", BOTH)
@pytest.mark.parametrize("stream", [True, False])
def test_count_disagreeing_with_ids_is_an_error(name, stream, fault_url):
    got, err = asyncio.run(run_one(name, f"{fault_url}/mismatch", stream=stream))
    assert isinstance(err, TokenCountError), repr(err)
    assert "completion_tokens=9" in str(err)
    # Streamed ids before the bad final chunk may have been yielded (only ids the server sent).
    assert got == sent_ids(N)[: len(got)] and (stream or got == [])


@pytest.mark.parametrize("name", BOTH)
def test_server_abort_is_an_error_not_a_short_output(name, fault_url):
    got, err = asyncio.run(run_one(name, f"{fault_url}/abort"))
    assert isinstance(err, ServerReportedError)
    assert ("injected abort" if name == "sglang" else "finish_reason='abort'") in str(err)
    # SGLang's abort chunk still carries the last id; OpenAI's aborted choice is refused whole.
    assert got == sent_ids(N)[: N if name == "sglang" else N - 1]


def test_openai_server_without_token_ids_is_refused(fault_url):
    got, err = asyncio.run(run_one("openai", f"{fault_url}/text_only"))
    assert isinstance(err, MalformedReplyError) and "return_token_ids" in str(err)
    assert got == []


@pytest.mark.parametrize("name", BOTH)
def test_stall_mid_stream_hits_the_first_token_timeout(name, fault_url):
    t0 = time.monotonic()
    got, err = asyncio.run(run_one(name, f"{fault_url}/stall", first_token_timeout_s=0.5))
    assert isinstance(err, ServerTimeoutError) and "sent nothing for 0.5 s" in str(err)
    assert 0.5 <= time.monotonic() - t0 < 30  # the timeout, not the 3600 s stall
    assert got == sent_ids(N)[: before_fault(N)]


@pytest.mark.parametrize("name", BOTH)
def test_stall_before_first_token_hits_the_first_token_timeout(name, fault_url):
    got, err = asyncio.run(run_one(name, f"{fault_url}/stall_first", first_token_timeout_s=0.5))
    assert isinstance(err, ServerTimeoutError) and got == []


@pytest.mark.parametrize("name", BOTH)
def test_stall_hits_the_total_timeout_when_first_token_timeout_is_off(name, fault_url):
    t0 = time.monotonic()
    got, err = asyncio.run(run_one(name, f"{fault_url}/stall", first_token_timeout_s=None, timeout_s=1.0))
    assert isinstance(err, ServerTimeoutError) and "total timeout (1.0 s)" in str(err)
    assert 1.0 <= time.monotonic() - t0 < 30  # the timeout, not the 3600 s stall
    assert got == sent_ids(N)[: before_fault(N)]


def test_retries_move_a_failed_request_to_another_server(fault_url):
    async def main(retries):
        async with make_backend("sglang", [f"{fault_url}/http500", f"{fault_url}/ok"], retries=retries) as b:
            got, err = await collect(b, [1], PARAMS)
            return got, err, b.describe()

    got, err, desc = asyncio.run(main(0))
    assert isinstance(err, ServerHTTPError)  # default: no retry hides the failure
    got, err, desc = asyncio.run(main(1))
    assert err is None and got == sent_ids(N)
    assert desc["retried_requests"] == 1
    assert desc["requests"][f"{fault_url}/http500"] == {"sent": 1, "failed": 1}


def test_no_retry_once_a_token_was_yielded(fault_url):
    async def main():
        async with make_backend("sglang", [f"{fault_url}/cut", f"{fault_url}/ok"], retries=3) as b:
            got, err = await collect(b, [1], PARAMS)
            return got, err, b.describe()

    got, err, desc = asyncio.run(main())
    assert isinstance(err, StreamBrokenError)
    assert got == sent_ids(N)[: before_fault(N)] and desc["retried_requests"] == 0


def test_least_outstanding_spreads_over_servers_and_concurrency_is_capped():
    proc, port = start_process([sys.executable, str(FAULT_SERVER), "--token-delay", "0.005"], "PORT ")
    base = f"http://127.0.0.1:{port}"

    async def main():
        async with make_backend("sglang", [f"{base}/ok1", f"{base}/ok2"], max_concurrency=3) as b:
            results = await asyncio.gather(
                *(collect(b, [i], SamplingParams(max_new_tokens=20)) for i in range(12))
            )
            return results, b.describe()

    try:
        results, desc = asyncio.run(main())
    finally:
        stop_process(proc)
    assert all(err is None and got == sent_ids(20) for got, err in results)
    sent = [desc["requests"][f"{base}/{p}"]["sent"] for p in ("ok1", "ok2")]
    assert sum(sent) == 12 and abs(sent[0] - sent[1]) <= 2, sent


def test_concurrency_cap_bounds_requests_in_flight_at_the_server():
    proc, port = start_process([sys.executable, str(FAULT_SERVER), "--token-delay", "0.005"], "PORT ")
    base = f"http://127.0.0.1:{port}"

    async def main():
        import aiohttp

        async with make_backend("openai", [f"{base}/ok"], max_concurrency=3) as b:
            await asyncio.gather(*(collect(b, [i], SamplingParams(max_new_tokens=20)) for i in range(12)))
        async with aiohttp.ClientSession() as s, s.get(f"{base}/stats") as r:
            return await r.json()

    try:
        stats = asyncio.run(main())
    finally:
        stop_process(proc)
    assert stats["total"] == 12 and stats["peak"] == 3


def test_bad_server_url_is_refused_with_a_clear_message():
    with pytest.raises(
        ValueError, match="--server-url must look like http://HOST:PORT, got 'localhost:30000'"
    ):
        make_backend("sglang", ["localhost:30000"])


# ------------------------------------------------------------------------- a server ignoring max_new_tokens


@pytest.mark.parametrize("name", BOTH)
@pytest.mark.parametrize("stream", [True, False])
def test_server_ignoring_max_new_tokens_is_cut_at_the_limit(name, stream, fault_url):
    async def main():
        async with make_backend(name, [f"{fault_url}/endless"], stream=stream) as backend:
            got, err = await collect(backend, [1, 2, 3], PARAMS)
            # With the session still open, the server sees the stream closed and stops writing it.
            for _ in range(400):
                if (await get_json(fault_url, "/stats"))["endless"] == 0:
                    return got, err, True
                await asyncio.sleep(0.05)
            return got, err, False

    got, err, closed = asyncio.run(main())
    assert isinstance(err, TokenLimitExceededError) and err.kind == "token_limit", repr(err)
    assert f"{fault_url}/endless" in str(err) and f"more than max_new_tokens={N} token ids" in str(err)
    assert got == sent_ids(N)  # exactly the first max_new_tokens ids, never more
    assert closed


def test_token_limit_failure_is_counted_by_name_in_a_run(fault_url, tmp_path):
    from tests.backends.httpkit import accuracy_tokens, run_mlperf

    proc = run_mlperf(
        "--backend",
        "openai",
        "--scenario",
        "server",
        "--accuracy",
        "--max-samples",
        4,
        "--output-dir",
        tmp_path,
        "--server-url",
        f"{fault_url}/endless",
        "--max-new-tokens",
        5,
        "--target-qps",
        20,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    log_dir = tmp_path / "server" / "accuracy"
    logged = accuracy_tokens(log_dir)
    assert len(logged) >= 1 and all(tokens == sent_ids(5) for tokens in logged.values())
    reasons = json.loads((log_dir / "run.json").read_text())["failures"]["reasons"]
    assert list(reasons) and all(r.startswith("TokenLimitExceededError: ") for r in reasons), reasons
    assert "TokenLimitExceededError" in proc.stdout

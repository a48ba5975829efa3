"""--retries against the fault-injection server: waits for Retry-After, backs off exponentially
without it (jittered, capped), reports a too-long Retry-After instead of waiting; the header's forms."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid

import pytest

from backends.http import ServerHTTPError
from tests.backends.fault_handlers import sent_ids
from tests.backends.httpkit import BOTH, PARAMS, N, collect, get_json, make_backend

pytestmark = pytest.mark.timeout(60)


def _busy(failures: int, retry: str) -> str:
    return f"busy_{failures}_{retry}_{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize("name", BOTH)
@pytest.mark.parametrize("retry_after", ["s1", "date2"])
def test_retry_waits_for_retry_after(name, retry_after, fault_url):
    fault = _busy(1, retry_after)

    async def main():
        async with make_backend(name, [f"{fault_url}/{fault}"], retries=2) as b:
            got, err = await collect(b, [1], PARAMS)
            return got, err, b.describe(), await get_json(fault_url, f"/times/{fault}")

    got, err, desc, times = asyncio.run(main())
    assert err is None and got == sent_ids(N)
    assert desc["retried_requests"] == 1 and len(times) == 2
    # Retry-After: 1, or an HTTP date 2 s ahead (whole seconds, so 1 to 2 s away): never sooner.
    assert 0.9 <= times[1] - times[0] < 30


def _one_request(fault_url: str, fault: str, retries: int):
    """One sglang request through the fault path with `retries`: (ids, error, the server's arrival times)."""

    async def main():
        async with make_backend("sglang", [f"{fault_url}/{fault}"], retries=retries) as b:
            got, err = await collect(b, [1], PARAMS)
            return got, err, await get_json(fault_url, f"/times/{fault}")

    return asyncio.run(main())


def test_retries_back_off_exponentially_without_retry_after(fault_url):

    fault = _busy(2, "none")

    got, err, times = _one_request(fault_url, fault, retries=2)
    assert err is None and got == sent_ids(N) and len(times) == 3
    gaps = [b - a for a, b in itertools.pairwise(times)]
    from backends.http_retry import BACKOFF_BASE_S as base

    # Equal jitter: retry k waits within [d/2, d], d = base * 2^k.
    assert gaps[0] >= base / 2 * 0.9 and gaps[1] >= base * 0.9, gaps
    assert all(g < 30 for g in gaps), gaps


def test_backoff_delays_grow_are_jittered_and_capped():
    from backends.http_retry import BACKOFF_BASE_S, BACKOFF_CAP_S, RETRY_AFTER_JITTER_S, retry_delay

    for attempt in range(12):
        d = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2**attempt)
        delays = [retry_delay(attempt, None) for _ in range(200)]
        assert all(d / 2 <= x <= d for x in delays)
        assert len(set(delays)) > 1  # jittered
    assert all(3.0 <= retry_delay(0, 3.0) <= 3.0 + RETRY_AFTER_JITTER_S for _ in range(50))
    assert retry_delay(0, 3600.0) is None  # longer than RETRY_AFTER_MAX_S: reported, not waited for


@pytest.mark.parametrize(
    "value, expected",
    [("2", 2.0), ("0", 0.0), (" 7 ", 7.0), ("soon", None), ("-1", None), ("", None), (None, None)],
)
def test_retry_after_header_values(value, expected):
    from backends.http_retry import parse_retry_after

    assert parse_retry_after(value) == expected


def test_retry_after_http_date():
    from email.utils import formatdate

    from backends.http_retry import parse_retry_after

    assert 28 <= parse_retry_after(formatdate(time.time() + 30, usegmt=True)) <= 30
    assert parse_retry_after(formatdate(time.time() - 30, usegmt=True)) == 0.0


def test_too_long_retry_after_is_reported_not_waited_for(fault_url):
    fault = _busy(5, "s3600")

    t0 = time.monotonic()
    got, err, times = _one_request(fault_url, fault, retries=3)
    assert time.monotonic() - t0 < 30
    assert isinstance(err, ServerHTTPError) and err.status == 503 and err.retry_after_s == 3600.0
    assert "injected overload" in str(err) and got == [] and len(times) == 1

"""--retries: the wait before a retry, from the server's Retry-After or a jittered backoff."""

from __future__ import annotations

import math
import random
import time

# --retries: equal-jitter exponential backoff, base * 2^attempt capped, drawn from [d/2, d]; a
# Retry-After (503/429) replaces it. A server asking for a longer pause than RETRY_AFTER_MAX_S is
# not retried: the failure is reported instead of holding the query for minutes.
BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 10.0
RETRY_AFTER_JITTER_S = 0.25
RETRY_AFTER_MAX_S = 60.0


def retry_delay(attempt: int, retry_after_s: float | None) -> float | None:
    """Seconds to wait before retry number attempt + 1; None when the server asks for too long a pause."""
    if retry_after_s is not None:
        if retry_after_s > RETRY_AFTER_MAX_S:
            return None
        return retry_after_s + random.uniform(0.0, RETRY_AFTER_JITTER_S)
    d = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2.0**attempt)
    return random.uniform(d / 2, d)


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After as seconds from now: delta-seconds or an HTTP date; None when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):  # neither seconds nor a date: the caller backs off on its own
        return None
    if when.tzinfo is None:  # an HTTP date is always GMT
        from datetime import UTC

        when = when.replace(tzinfo=UTC)
    seconds = when.timestamp() - time.time()
    return max(0.0, seconds) if math.isfinite(seconds) else None

"""The failures of the HTTP backends: each class names a cause, `kind` is its short name."""

from __future__ import annotations

from backends.base import BackendError


class HttpBackendError(BackendError):
    """A request to an HTTP server failed; `kind` is the short name failure reports count by."""

    kind = "http"
    retryable = False


class ServerConnectError(HttpBackendError):
    kind, retryable = "connect", True


class ServerHTTPError(HttpBackendError):
    kind = "http_status"

    def __init__(self, message: str, status: int, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = status == 429 or status >= 500
        self.retry_after_s = retry_after_s  # the server's Retry-After, in seconds from now


class StreamBrokenError(HttpBackendError):
    kind, retryable = "stream_cut", True  # retried only while no token has been yielded


class ServerTimeoutError(HttpBackendError):
    kind = "timeout"  # never retried: a retry after a timeout would hide it in the latency


class MalformedReplyError(HttpBackendError):
    kind = "malformed"


class ServerReportedError(HttpBackendError):
    kind = "server_error"  # an error event or an abort finish in a 200 reply


class TokenCountError(HttpBackendError):
    kind = "count_mismatch"  # token ids and the server's own count disagree


class TokenLimitExceededError(HttpBackendError):
    kind = "token_limit"  # more ids than the request's max_new_tokens: the server ignored the limit

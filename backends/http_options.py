"""The flags the sglang and openai backends share (HttpOptions); core flags such as --server-url
live in RunConfig."""

from __future__ import annotations

from dataclasses import dataclass, field


def _off_at_zero(text: str) -> float | None:
    value = float(text)
    return None if value == 0 else value


@dataclass(frozen=True, slots=True)
class HttpOptions:
    """Flags of the sglang and openai backends (core flags such as --server-url live in RunConfig).
    Each field with "help" metadata is a flag (harness/cli.py)."""

    retries: int = field(
        default=0,
        metadata={
            "help": "retry a request that failed before its first token (connect error, HTTP 5xx/429, cut "
            "stream) up to N times on the least busy server; 0: every failure counts",
            "metavar": "N",
        },
    )
    connect_timeout_s: float = field(
        default=10.0,
        metadata={"help": "seconds to open a TCP connection", "flag": "--connect-timeout", "metavar": "S"},
    )
    first_token_timeout_s: float | None = field(
        default=600.0,
        metadata={  # also the longest silence mid-stream
            "help": "fail a streamed request with no token S seconds after it was sent, or silent for S "
            "seconds mid-stream; 0 disables",
            "flag": "--first-token-timeout",
            "metavar": "S",
            "type": _off_at_zero,
        },
    )
    ready_timeout_s: float = field(
        default=600.0,
        metadata={
            "help": "seconds to wait for every server's GET /health to answer 200",
            "flag": "--ready-timeout",
            "metavar": "S",
        },
    )
    stream: bool = field(
        default=True, metadata={"help": "stream tokens over SSE; --no-stream waits for whole replies"}
    )

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")
        for name in ("connect_timeout_s", "first_token_timeout_s", "ready_timeout_s"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < float("inf"):
                raise ValueError(f"{name} must be a number of seconds >= 0, got {value}")

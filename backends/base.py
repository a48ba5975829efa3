"""The one protocol every backend implements (token ids in, streamed token ids out), and its types.

backends/ imports nothing of the harness: the harness depends on backends, never the reverse.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, Self

# <|return|>, <|call|>, <|endoftext|>: where gpt-oss stops generating.
STOP_TOKEN_IDS: tuple[int, ...] = (200002, 200012, 199999)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How one request is decoded; every backend turns it into its engine's own."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k
    ignore_eos: bool = False
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = STOP_TOKEN_IDS

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.temperature >= 0:  # also refuses NaN
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


class BackendError(RuntimeError):
    """A request failed inside a backend (server error, engine error, bad reply).

    The message is what the user sees in the failure report, so it names the cause
    (e.g. "HTTP 500 from http://127.0.0.1:30000/generate: out of memory").
    """


class RunSpec(Protocol):
    """What a backend reads of the run's configuration (harness.config.RunConfig is one)."""

    @property
    def scenario(self) -> str: ...  # "offline" | "server" | "interactive"
    @property
    def model_path(self) -> Path | None: ...
    @property
    def server_urls(self) -> tuple[str, ...]: ...
    @property
    def max_concurrency(self) -> int | None: ...
    @property
    def timeout_s(self) -> float | None: ...
    @property
    def backend_options(self) -> Any: ...  # an instance of the backend's Options, or None: its defaults
    @property
    def log_dir(self) -> Path: ...  # the run's log folder, where a backend may write its own log


class Backend(Protocol):
    """A backend class. Its module defines `create(cfg: RunSpec) -> Backend`, which checks the
    options (its errors come before LoadGen starts); the class says what the harness needs to know.
    """

    name: ClassVar[str]
    # Runs the model itself (in this process, or in a server it starts): --server-url means nothing to it.
    in_process: ClassVar[bool]
    # The frozen dataclass of the backend's flags; harness/cli.py turns its fields into flags
    # (field metadata: "help", optional "flag", "choices", "type", "metavar", "repeat", "default_help").
    Options: ClassVar[type]
    # Known once started (after __aenter__); None where only the server knows (the check is its own).
    max_model_len: int | None
    vocab_size: int | None

    @classmethod
    def default_model_path(cls) -> Path | None:
        """The checkpoint to run without --model-path (None: the flag is required, or unused)."""

    async def __aenter__(self) -> Self:
        """Start the engine or open the connection pool; raise with a clear message on bad options."""

    async def __aexit__(self, *exc: object) -> None:
        """Stop cleanly: no stray processes, threads or sockets."""

    def stream(self, prompt: list[int], params: SamplingParams) -> AsyncIterator[list[int]]:
        """Yield newly generated token ids until the request finishes; raise on failure.

        Every yielded list is non-empty and holds only ids the model produced, in order;
        the concatenation is the whole output (a matched stop token included).
        Cancelling the iterating task aborts the request in the backend.
        """

    def describe(self) -> dict[str, Any]:
        """Backend settings for run.json (engine options, server URLs, versions)."""

"""Test-only backends, registered as 'fake': deterministic tokens, injected failures and stalls."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Self

from backends.base import RunSpec, SamplingParams

MODULE = "tests.harness.fakes"


def expected_tokens(prompt: list[int], params: SamplingParams) -> list[int]:
    """What the fake model generates for `prompt`: deterministic, distinct per prompt."""
    n = params.max_new_tokens if params.ignore_eos else min(params.max_new_tokens, 3 + sum(prompt) % 9)
    seed = sum(prompt[-4:]) * 131 + len(prompt)
    return [(seed + 7919 * i) % 200000 for i in range(n)]


@dataclass(frozen=True, slots=True)
class FakeOptions:
    delay_s: float = field(default=0.0, metadata={"help": "sleep before each chunk", "flag": "--fake-delay"})
    chunk: int = field(
        default=3,
        metadata={"help": "tokens per chunk after the first (always 1 token)", "flag": "--fake-chunk"},
    )
    fail_every: int = field(
        default=0,
        metadata={"help": "every Nth request raises after its first chunk", "flag": "--fake-fail-every"},
    )
    stall_every: int = field(
        default=0,
        metadata={"help": "every Nth request hangs after its first chunk", "flag": "--fake-stall-every"},
    )
    fail_at: int = field(
        default=1,
        metadata={  # 0: before any token
            "help": "the chunk index at which failures and stalls happen",
            "flag": "--fake-fail-at",
        },
    )
    stubborn_s: float = field(
        default=0.0,
        metadata={  # > 0: a stall ignores cancellation this long, then ends
            "help": "seconds a stall ignores cancellation",
            "flag": "--fake-stubborn",
        },
    )
    fail_start: bool = field(
        default=False,
        metadata={  # as a server that is not up would
            "help": "__aenter__ raises BackendError",
            "flag": "--fake-fail-start",
        },
    )
    max_model_len: int | None = field(default=None, metadata={"help": "the context the backend reports"})
    serial: bool = field(
        default=False,
        metadata={  # an overloaded server: latency grows with the arrival rate
            "help": "serve one request at a time",
            "flag": "--fake-serial",
        },
    )
    mark_file: str | None = field(
        default=None,
        metadata={  # lets a test in another process wait for streaming
            "help": "a line is appended here when a request yielded its first chunk",
            "flag": "--fake-mark-file",
        },
    )


class InjectedFailure(RuntimeError):
    pass


@dataclass
class FakeBackend:
    name: ClassVar[str] = "fake"
    in_process: ClassVar[bool] = False  # takes --server-url, as the reference command line gives it
    Options: ClassVar[type] = FakeOptions
    opts: FakeOptions
    calls: int = 0
    # prompt -> the tokens yielded for each request with that prompt
    yielded: dict[tuple[int, ...], list[list[int]]] = field(default_factory=dict)
    entered: bool = False
    exited: bool = False
    enters: int = 0
    vocab_size: int | None = None
    slot: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def max_model_len(self) -> int | None:
        return self.opts.max_model_len

    @classmethod
    def default_model_path(cls) -> Path | None:
        return None

    async def __aenter__(self) -> Self:
        if self.opts.fail_start:
            from backends.base import BackendError

            raise BackendError("fake server at http://127.0.0.1:9 is not reachable")
        self.entered = True
        self.enters += 1
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.exited = True

    async def stream(self, prompt: list[int], params: SamplingParams):
        if self.opts.serial:
            async with self.slot:
                async for chunk in self._stream(prompt, params):
                    yield chunk
        else:
            async for chunk in self._stream(prompt, params):
                yield chunk

    async def _stream(self, prompt: list[int], params: SamplingParams):
        self.calls += 1
        call = self.calls
        out = expected_tokens(prompt, params)
        sent: list[int] = []
        self.yielded.setdefault(tuple(prompt), []).append(sent)
        chunks = [out[:1]] + [out[i : i + self.opts.chunk] for i in range(1, len(out), self.opts.chunk)]
        for k, chunk in enumerate(chunks):
            if self.opts.delay_s:
                await asyncio.sleep(self.opts.delay_s)
            if k == self.opts.fail_at and self.opts.fail_every and call % self.opts.fail_every == 0:
                raise InjectedFailure(f"injected failure (every {self.opts.fail_every}th request)")
            if k == self.opts.fail_at and self.opts.stall_every and call % self.opts.stall_every == 0:
                if not self.opts.stubborn_s:
                    await asyncio.Event().wait()
                end = asyncio.get_running_loop().time() + self.opts.stubborn_s
                while (left := end - asyncio.get_running_loop().time()) > 0:
                    try:
                        await asyncio.sleep(left)
                    except asyncio.CancelledError:  # noqa: S112 - a misbehaving backend swallows the cancel
                        continue
            sent.extend(chunk)
            yield chunk
            if k == 0 and self.opts.mark_file:  # lets a test in another process wait for streaming
                with open(self.opts.mark_file, "a") as f:
                    f.write(f"{call}\n")

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "options": self.opts}


LAST: FakeBackend | None = None


def create(cfg: RunSpec) -> FakeBackend:
    global LAST
    LAST = FakeBackend(cfg.backend_options or FakeOptions())
    return LAST


def register() -> None:
    """Make '--backend fake' known to the registry (tests and tests/harness/fake_run.py)."""
    import backends

    backends.SPECS["fake"] = backends.Spec(MODULE, "FakeBackend", (), "(test-only backend)")
    if "fake" not in backends.NAMES:
        backends.NAMES = (*backends.NAMES, "fake")

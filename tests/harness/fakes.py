"""Test-only backends, registered as 'fake': deterministic tokens, injected failures and stalls."""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass, field
from typing import Any, Self

from harness.config import RunConfig, SamplingParams

MODULE = "tests.harness.fakes"


def expected_tokens(prompt: list[int], params: SamplingParams) -> list[int]:
    """What the fake model generates for `prompt`: deterministic, distinct per prompt."""
    n = params.max_new_tokens if params.ignore_eos else min(params.max_new_tokens, 3 + sum(prompt) % 9)
    seed = sum(prompt[-4:]) * 131 + len(prompt)
    return [(seed + 7919 * i) % 200000 for i in range(n)]


@dataclass(frozen=True, slots=True)
class FakeOptions:
    delay_s: float = 0.0  # sleep before each chunk
    chunk: int = 3  # tokens per chunk after the first (which is always 1 token)
    fail_every: int = 0  # every Nth request raises after its first chunk
    stall_every: int = 0  # every Nth request hangs forever after its first chunk
    fail_at: int = 1  # the chunk index at which failures and stalls happen (0: before any token)
    stubborn_s: float = 0.0  # > 0: a stall ignores cancellation for this long, then yields the rest
    fail_start: bool = False  # __aenter__ raises BackendError, as a server that is not up would
    mark_file: str | None = None  # a line is appended here when a request yielded its first chunk


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fake-delay", type=float, default=0.0)
    parser.add_argument("--fake-chunk", type=int, default=3)
    parser.add_argument("--fake-fail-every", type=int, default=0)
    parser.add_argument("--fake-stall-every", type=int, default=0)
    parser.add_argument("--fake-fail-at", type=int, default=1)
    parser.add_argument("--fake-stubborn", type=float, default=0.0)
    parser.add_argument("--fake-fail-start", action="store_true")
    parser.add_argument("--fake-mark-file", default=None)


def options(ns: argparse.Namespace) -> FakeOptions:
    return FakeOptions(
        ns.fake_delay,
        ns.fake_chunk,
        ns.fake_fail_every,
        ns.fake_stall_every,
        ns.fake_fail_at,
        ns.fake_stubborn,
        ns.fake_fail_start,
        ns.fake_mark_file,
    )


class InjectedFailure(RuntimeError):
    pass


@dataclass
class FakeBackend:
    opts: FakeOptions
    name: str = "fake"
    calls: int = 0
    # prompt -> the tokens yielded for each request with that prompt
    yielded: dict[tuple[int, ...], list[list[int]]] = field(default_factory=dict)
    entered: bool = False
    exited: bool = False

    async def __aenter__(self) -> Self:
        if self.opts.fail_start:
            from backends.base import BackendError

            raise BackendError("fake server at http://127.0.0.1:9 is not reachable")
        self.entered = True
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.exited = True

    async def stream(self, prompt: list[int], params: SamplingParams):
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
                    except asyncio.CancelledError:
                        continue  # a misbehaving backend: swallows the cancel, keeps streaming
            sent.extend(chunk)
            yield chunk
            if k == 0 and self.opts.mark_file:  # lets a test in another process wait for streaming
                with open(self.opts.mark_file, "a") as f:
                    f.write(f"{call}\n")

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "options": self.opts}


LAST: FakeBackend | None = None


def create(cfg: RunConfig) -> FakeBackend:
    global LAST
    LAST = FakeBackend(cfg.backend_options or FakeOptions())
    return LAST


def register() -> None:
    """Make '--backend fake' known to the registry (tests and tests/harness/fake_run.py)."""
    import backends

    backends.SPECS["fake"] = backends.Spec(MODULE, MODULE, (), "(test-only backend)")
    if "fake" not in backends.NAMES:
        backends.NAMES = (*backends.NAMES, "fake")

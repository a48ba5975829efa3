"""Untimed warm-up queries, sent to the started backend before LoadGen's clock starts (--warmup N).

An engine's first steps at a new shape pay one-off costs: Triton kernels compiled for a new token
bucket, CUDA graphs captured lazily, allocator growth. Offline hides them in its long run; in
Server they land on the first queries' time to first token and can alone push TTFT p99 past
MLPerf's limit (vLLM's own `bench serve` has --num-warmups for the same reason).

The prompts are random token ids with the dataset's prompt lengths (evenly spaced quantiles, so the
shortest and the longest are covered), never the dataset's own prompts: a prefix cache must not
serve the timed run from the warm-up. They go out in doubling waves (1, 1, 2, 4, ...) so the
engine meets every batch size up to the largest wave, both in prefill and in decode.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from backends.base import Backend, BackendError, SamplingParams
from harness.config import VOCAB_SIZE

if TYPE_CHECKING:
    from harness.loop import LoopThread
    from harness.runner import Run

OUTPUT_TOKENS = 32  # enough decode steps at each wave's batch size; short next to a real query
SEED = 20261123


@dataclass(frozen=True, slots=True)
class WarmupResult:
    queries: int
    failed: int
    seconds: float
    first_error: str | None

    def as_dict(self) -> dict[str, object]:
        return {
            "queries": self.queries,
            "failed": self.failed,
            "seconds": round(self.seconds, 3),
            "first_error": self.first_error,
        }


def warmup_prompts(prompt_lens: list[int], n: int, vocab_size: int) -> list[list[int]]:
    """n prompts of random ids in [0, vocab_size) whose lengths are n evenly spaced quantiles of
    prompt_lens (the first is the shortest, the last the longest)."""
    if n < 1 or not prompt_lens:
        return []
    lens = np.sort(np.asarray(prompt_lens))
    picks = lens[np.round(np.linspace(0, len(lens) - 1, n)).astype(int)]
    rng = np.random.default_rng(SEED)
    return [rng.integers(0, vocab_size, size=int(k)).tolist() for k in picks]


def waves(n: int) -> list[int]:
    """Sizes of the doubling waves that add up to n: 1, 1, 2, 4, ..., the last one cut to fit."""
    sizes, size, left = [], 1, n
    while left > 0:
        sizes.append(min(size, left))
        left -= sizes[-1]
        size = size if len(sizes) == 1 else size * 2
    return sizes


async def _one(backend: Backend, prompt: list[int], params: SamplingParams) -> str | None:
    try:
        async for _ in backend.stream(prompt, params):
            pass
    except Exception as e:  # noqa: BLE001 - a BackendError, or anything a broken backend raises
        return f"{type(e).__name__}: {e}"
    return None


async def warmup(backend: Backend, prompts: list[list[int]]) -> WarmupResult:
    """Sends the prompts wave by wave (each wave's queries at once), greedy, OUTPUT_TOKENS each."""
    params = SamplingParams(max_new_tokens=OUTPUT_TOKENS, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    errors: list[str] = []
    i = 0
    for size in waves(len(prompts)):
        results = await asyncio.gather(*(_one(backend, p, params) for p in prompts[i : i + size]))
        errors += [e for e in results if e is not None]
        i += size
    return WarmupResult(len(prompts), len(errors), time.perf_counter() - start, errors[0] if errors else None)


def warm_up(r: Run, backend: Backend, loop: LoopThread) -> None:
    """--warmup N: the untimed queries (harness/warmup.py), recorded in run.json. Some failing is a
    warning; all failing stops the run before LoadGen, since the timed run would fail the same way."""
    n = r.cfg.warmup
    if n == 0:
        return
    prompts = warmup_prompts([len(p) for p in r.dataset.prompts], n, backend.vocab_size or VOCAB_SIZE)
    r.console.print(f"warm-up: {n} untimed queries ...")
    result = loop.run(warmup(backend, prompts))
    r.record["warmup"] = result.as_dict()
    r.save()
    if result.failed == result.queries:
        raise BackendError(f"all {n} warm-up queries failed; the first: {result.first_error}")
    line = f"warm-up: {n} queries in {result.seconds:.1f} s"
    if result.failed:
        line += f", [bold yellow]{result.failed} failed[/] (first: {result.first_error})"
    r.console.print(line, soft_wrap=True)

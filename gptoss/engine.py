"""The engine: a synchronous core (schedule, run, postprocess) on its own thread, streamed to asyncio.

The engine thread does all torch work and sleeps on a condition variable when idle. The asyncio
side only hands requests in (under a lock, then notify) and receives each step's deltas through
one loop.call_soon_threadsafe per step.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import weakref
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Self

from gptoss.sampling import SamplingParams

DTYPES = ("bfloat16", "float32")


def _flag(help: str, **more: object) -> dict[str, object]:
    """Field metadata that makes the field a flag (read by harness/cli.py and gptoss/serve/main.py)."""
    return {"help": help, **more}


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """The engine's settings. The fields with flag metadata are the flags of --backend gptoss and of
    python -m gptoss.serve, so a knob is declared once, here."""

    model_path: Path | None = None  # set before the engine starts (--model-path is a flag of its own)
    device: str | None = field(
        default=None,
        metadata=_flag("cpu, cuda or cuda:N", default_help="cuda when torch sees a GPU, else cpu"),
    )
    dtype: str = field(default="bfloat16", metadata=_flag("activations and KV cache", choices=DTYPES))
    max_num_seqs: int = field(default=256, metadata=_flag("most running requests"))
    max_num_batched_tokens: int = field(
        default=8192, metadata=_flag("tokens per engine step; longer prompts prefill in chunks")
    )
    max_model_len: int | None = field(
        default=None,
        metadata=_flag("prompt + output limit", default_help="the checkpoint's, capped by the KV cache"),
    )
    kv_cache_tokens: int | None = field(
        default=None, metadata=_flag("KV cache size in tokens", default_help="sized from free memory")
    )
    block_size: int = 16
    seed: int = field(default=0, metadata=_flag("seeds the sampling of requests that carry no seed"))
    kernels: str | None = field(
        default=None,
        metadata=_flag(
            "torch: the reference model; triton: our fused kernels",
            choices=("torch", "triton"),
            default_help="triton on CUDA, torch on CPU",
        ),
    )
    cuda_graphs: bool = field(
        default=True, metadata=_flag("replay CUDA graphs for decode steps (triton kernels on CUDA)")
    )
    decode_steps: int = field(
        default=8,
        metadata=_flag(
            "decode steps run back to back on the GPU when no waiting request could join "
            "(CUDA graphs only; 1: a host round trip every step)"
        ),
    )

    def __post_init__(self) -> None:
        if self.device is not None and self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, got {self.device!r}")
        if self.kernels not in (None, "torch", "triton"):
            raise ValueError(f"kernels must be torch or triton, got {self.kernels!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "decode_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_model_len", "kv_cache_tokens"):
            value = getattr(self, name)
            if value is not None and value < 2:
                raise ValueError(f"{name} must be >= 2, got {value}")


@dataclass(slots=True)
class Delta:
    token_ids: list[int]  # new ids since the previous Delta (may be empty only when finishing)
    finish_reason: str | None  # None while running; "stop" | "length" | "abort" at the end
    stop_token_id: int | None = None  # the matched stop id when finish_reason == "stop"


class EngineError(RuntimeError):
    """The engine failed while this request was in flight; __cause__ holds the original error."""


class LLMEngine:
    """The synchronous core: add, abort, step. Not thread-safe; AsyncEngine drives it from one thread."""

    def __init__(self, config: EngineConfig) -> None:
        # torch is imported here, not at module level, so EngineConfig/Delta stay importable without it.
        from gptoss.block_manager import BlockManager
        from gptoss.model_runner import ModelRunner
        from gptoss.scheduler import Scheduler

        if config.model_path is None:
            raise ValueError("EngineConfig.model_path is not set: give the checkpoint directory")
        if config.device is None:
            import torch

            config = replace(config, device="cuda" if torch.cuda.is_available() else "cpu")
        self.config = config
        self.runner = ModelRunner(config)
        self.max_model_len = self.runner.max_model_len
        self.vocab_size = self.runner.vocab_size
        bm = BlockManager(
            self.runner.num_full_blocks, config.block_size, self.runner.window, self.runner.num_ring_blocks
        )
        watermark = max(1, self.runner.num_full_blocks // 100)
        self.scheduler = Scheduler(bm, config.max_num_seqs, config.max_num_batched_tokens, watermark)
        self.seqs: dict = {}  # request_id -> Sequence, until it finishes
        self._ids = itertools.count()

    def check_prompt(self, prompt: list[int]) -> None:
        if not prompt:
            raise ValueError("prompt is empty: at least one token id is needed")
        if len(prompt) >= self.max_model_len:
            raise ValueError(
                f"prompt has {len(prompt)} tokens but max_model_len is {self.max_model_len}: "
                f"at most {self.max_model_len - 1} prompt tokens leave room for one output token"
            )
        lo, hi = min(prompt), max(prompt)
        if lo < 0 or hi >= self.vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(f"prompt holds token id {bad}, outside the vocabulary [0, {self.vocab_size})")

    def add(self, request_id: str, prompt: list[int], params: SamplingParams) -> None:
        from gptoss.sequence import Sequence

        self.check_prompt(prompt)
        if request_id in self.seqs:
            raise ValueError(f"request id {request_id!r} is already running")
        seq = Sequence(next(self._ids), request_id, prompt, params, self.max_model_len, self.config.seed)
        self.seqs[request_id] = seq
        self.scheduler.add(seq)

    def abort(self, request_id: str) -> bool:
        seq = self.seqs.pop(request_id, None)
        if seq is None:
            return False
        self.scheduler.abort(seq)
        return True

    def has_work(self) -> bool:
        return len(self.scheduler) > 0

    def step(self) -> list[tuple[str, Delta]]:
        batch = self.scheduler.schedule()
        if not batch:
            return []
        k = self._lookahead(batch)
        if k > 1:
            out = []
            for seq, n in self.scheduler.postprocess_multi(
                batch, self.runner.kernel_runner.run_multi(batch, k)
            ):
                out.append((seq.request_id, Delta(seq.token_ids[-n:], seq.finish_reason, seq.stop_token_id)))
                if seq.finish_reason is not None:
                    del self.seqs[seq.request_id]
            return out
        sampled = self.runner.run(batch)
        out = []
        for seq in self.scheduler.postprocess(batch, sampled):
            out.append((seq.request_id, Delta([seq.token_ids[-1]], seq.finish_reason, seq.stop_token_id)))
            if seq.finish_reason is not None:
                del self.seqs[seq.request_id]
        return out

    def _lookahead(self, batch) -> int:
        """How many decode steps to run back to back on the device (1: an ordinary step).

        Only a pure decode batch on CUDA graphs, and only while no waiting request could join: a
        multi-step would delay its prefill. Capped by the longest remaining output (no step is
        wasted on every sequence), by the context limit, and by free KV blocks."""
        kr, k = self.runner.kernel_runner, self.config.decode_steps
        if k <= 1 or kr is None or not kr.can_multi_step(batch):
            return 1
        sch = self.scheduler
        if sch.waiting and len(sch.running) < sch.max_num_seqs:
            return 1
        k = min(
            k,
            max(s.max_tokens - s.num_tokens for s in batch.seqs),
            min(self.max_model_len - s.num_computed for s in batch.seqs),
        )
        return k if k > 1 and sch.extend_decode(batch, k) else 1

    def fail_all(self) -> list[str]:
        """Drop every request after a failed step (its KV writes may be half done); return their ids."""
        ids = list(self.seqs)
        self.scheduler.abort_all()
        self.seqs.clear()
        return ids

    def generate(
        self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]
    ) -> list[list[int]]:
        """Run prompts to completion (offline use and tests); output ids in prompt order."""
        params = params if isinstance(params, list) else [params] * len(prompts)
        base = next(self._ids)
        ids = [f"gen-{base}-{i}" for i in range(len(prompts))]
        for rid, prompt, p in zip(ids, prompts, params, strict=True):
            self.add(rid, prompt, p)
        outputs: dict[str, list[int]] = {rid: [] for rid in ids}
        while self.has_work():
            for rid, delta in self.step():
                outputs[rid] += delta.token_ids
        return [outputs[rid] for rid in ids]


_Item = Delta | BaseException


class AsyncEngine:
    """Streams each request's Deltas to asyncio; the engine thread does the work."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.max_model_len = 0  # known once the model is loaded
        self.vocab_size = 0
        self._core: LLMEngine | None = None
        self._cond = threading.Condition()
        self._inbox: list[tuple[str, list[int], SamplingParams]] = []  # guarded by _cond
        self._aborts: list[str] = []  # guarded by _cond
        self._stopping = False
        self._fatal: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Weak, so a stream its consumer dropped is collected, and its __del__ aborts the request.
        self._streams: weakref.WeakValueDictionary[str, _Stream] = weakref.WeakValueDictionary()
        self._ids = itertools.count()

    async def __aenter__(self) -> Self:
        self._loop = asyncio.get_running_loop()
        self._core = await asyncio.to_thread(LLMEngine, self.config)
        self.max_model_len = self._core.max_model_len
        self.vocab_size = self._core.vocab_size
        self._thread = threading.Thread(target=self._run, name="gptoss-engine", daemon=True)
        self._thread.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        self._fail_streams(list(self._streams), "the engine was shut down with this request in flight")

    def info(self) -> dict[str, object]:
        """The sizes the engine settled on (for run.json): limits, KV cache, MoE path."""
        core = self._core
        if core is None:
            return {}
        r = core.runner
        return {
            "device": core.config.device,
            "max_model_len": core.max_model_len,
            "kv_cache_tokens": r.kv_cache_tokens,
            "kv_ring_blocks": r.num_ring_blocks,
            "block_size": self.config.block_size,
            "max_num_seqs": self.config.max_num_seqs,
            "max_num_batched_tokens": self.config.max_num_batched_tokens,
            "dtype": self.config.dtype,
            "dense_moe": r.dense_moe,
            "kernels": r.kernels,
            "cuda_graphs": sorted(r.kernel_runner.graphs) if r.kernel_runner is not None else [],
        }

    def generate(
        self,
        prompt: list[int],
        params: SamplingParams,
        request_id: str | None = None,
        final_only: bool = False,
    ) -> _Stream:
        """Queue a request; iterate the result for its Deltas. Bad input raises here, at once."""
        core = self._core
        if core is None or self._thread is None or self._stopping:
            raise RuntimeError("the engine is not running: use `async with AsyncEngine(config) as engine`")
        if self._fatal is not None:
            raise EngineError(f"the engine thread died: {self._fatal!r}") from self._fatal
        core.check_prompt(prompt)
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        if rid in self._streams:
            raise ValueError(f"request id {rid!r} is already in flight")
        stream = _Stream(self, rid, final_only)
        self._streams[rid] = stream
        with self._cond:
            self._inbox.append((rid, list(prompt), params))
            self._cond.notify()
        return stream

    def abort(self, request_id: str) -> None:
        """Stop a request; its iterator ends with finish_reason "abort". Safe from any thread."""
        with self._cond:
            self._aborts.append(request_id)
            self._cond.notify()

    # ---- engine thread ----------------------------------------------------------------------

    def _run(self) -> None:
        core = self._core
        assert core is not None
        try:
            while True:
                with self._cond:
                    while not (self._inbox or self._aborts or self._stopping or core.has_work()):
                        self._cond.wait()
                    if self._stopping:
                        return
                    inbox, self._inbox = self._inbox, []
                    aborts, self._aborts = self._aborts, []
                out: list[tuple[str, _Item]] = []
                for rid, prompt, params in inbox:
                    try:
                        core.add(rid, prompt, params)
                    except ValueError as e:  # e.g. a duplicate id; generate() checked the rest
                        out.append((rid, e))
                out += [(rid, Delta([], "abort")) for rid in aborts if core.abort(rid)]
                try:
                    out += core.step()
                except Exception as e:
                    failed = core.fail_all()
                    out += [(rid, _engine_error(e)) for rid in failed]
                if out:
                    self._loop.call_soon_threadsafe(self._deliver, out)
        except BaseException as e:  # a bug in this loop: fail everything in flight, loudly
            self._fatal = e
            ids = core.fail_all()
            self._loop.call_soon_threadsafe(self._deliver, [(rid, _engine_error(e)) for rid in ids])
            raise

    # ---- event loop -------------------------------------------------------------------------

    def _deliver(self, items: list[tuple[str, _Item]]) -> None:
        for rid, item in items:
            stream = self._streams.get(rid)
            if stream is not None:
                stream._push(item)

    def _fail_streams(self, ids: list[str], message: str) -> None:
        for rid in ids:
            stream = self._streams.get(rid)
            if stream is not None and not stream._closed:
                stream._push(EngineError(message))


def _engine_error(e: BaseException) -> EngineError:
    err = EngineError(f"engine step failed: {type(e).__name__}: {e}")
    err.__cause__ = e
    return err


class _Stream:
    """One request's AsyncIterator[Delta]. Deltas that queued up are merged into one."""

    __slots__ = ("_engine", "request_id", "_items", "_waiter", "_closed", "_final_only", "__weakref__")

    def __init__(self, engine: AsyncEngine, request_id: str, final_only: bool = False) -> None:
        self._engine = engine
        self.request_id = request_id
        self._items: deque[_Item] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False  # the final Delta or an error has been pushed
        # Offline wants whole outputs: its consumer is woken once, at the end, not every step (with
        # a thousand requests in flight, a wake-up per request per step costs the engine thread
        # the GIL); the Deltas queue up meanwhile and are merged into one.
        self._final_only = final_only

    def _push(self, item: _Item) -> None:
        if self._closed:
            return
        self._items.append(item)
        if isinstance(item, BaseException) or item.finish_reason is not None:
            self._closed = True
            self._engine._streams.pop(self.request_id, None)
        if self._final_only and not self._closed:
            return
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Delta:
        while not self._items:
            if self._closed:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            except asyncio.CancelledError:
                self.close()
                raise
            finally:
                self._waiter = None
        first = self._items.popleft()
        if isinstance(first, BaseException):
            self._items.clear()
            raise first
        while self._items and first.finish_reason is None and isinstance(self._items[0], Delta):
            nxt = self._items.popleft()
            first.token_ids += nxt.token_ids
            first.finish_reason, first.stop_token_id = nxt.finish_reason, nxt.stop_token_id
        return first

    def close(self) -> None:
        """Abort the request if it is still running (leaving the loop early, cancellation, GC)."""
        if not self._closed:
            self._closed = True
            self._items.clear()
            self._engine._streams.pop(self.request_id, None)
            self._engine.abort(self.request_id)

    async def aclose(self) -> None:
        self.close()

    def __del__(self) -> None:
        if not self._closed:
            self.close()

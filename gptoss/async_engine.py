"""AsyncEngine: the synchronous core (gptoss.engine.LLMEngine) on its own thread, streamed to asyncio.

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
from typing import Self

from gptoss.engine import Delta, EngineConfig, EngineError, LLMEngine
from gptoss.sampling import SamplingParams

_Item = Delta | BaseException


class AsyncEngine:
    """Streams each request's Deltas to asyncio; the engine thread does the work."""

    num_replicas = 1

    def __init__(self, config: EngineConfig) -> None:
        if config.num_replicas > 1:
            raise ValueError(
                f"AsyncEngine runs one replica, the config asks for {config.num_replicas}: "
                "use gptoss.dp_engine.open_engine"
            )
        self.config = config
        self.max_model_len = 0  # known once the model is loaded
        self.vocab_size = 0
        self._core: LLMEngine | None = None
        self._cond = threading.Condition()
        self._inbox: list[tuple[str, list[int], SamplingParams, str | None]] = []  # guarded by _cond
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
        return self._core.info() if self._core is not None else {}

    def adapters(self) -> dict[str, str]:
        """The loaded LoRA adapters: name -> folder (requests name one to use it)."""
        lora = self._core.runner.lora if self._core is not None else None
        return {} if lora is None else {a.name: str(a.path) for a in lora.adapters}

    def generate(
        self,
        prompt: list[int],
        params: SamplingParams,
        request_id: str | None = None,
        final_only: bool = False,
        lora: str | None = None,
    ) -> _Stream:
        """Queue a request (through the LoRA adapter named `lora`, if given); iterate the result for its
        Deltas. Bad input raises here, at once."""
        core = self._core
        if core is None or self._thread is None or self._stopping:
            raise RuntimeError("the engine is not running: use `async with AsyncEngine(config) as engine`")
        if self._fatal is not None:
            raise EngineError(f"the engine thread died: {self._fatal!r}") from self._fatal
        core.check_prompt(prompt)
        core.lora_index(lora)
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        if rid in self._streams:
            raise ValueError(f"request id {rid!r} is already in flight")
        stream = _Stream(self, rid, final_only)
        self._streams[rid] = stream
        with self._cond:
            self._inbox.append((rid, list(prompt), params, lora))
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
                for rid, prompt, params, lora in inbox:
                    try:
                        core.add(rid, prompt, params, lora)
                    except ValueError as e:  # e.g. a duplicate id; generate() checked the rest
                        out.append((rid, e))
                out += [(rid, Delta([], "abort")) for rid in aborts if core.abort(rid)]
                try:
                    out += core.step()
                except Exception as e:  # noqa: BLE001 - every request of the step fails with it
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

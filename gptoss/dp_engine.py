"""DPEngine: N engine replicas, one process per device, behind AsyncEngine's interface (open_engine).

Each replica (gptoss.dp_replica) loads its own weights and sizes its own KV cache. One request queue
feeds them: generate() sends each request to the live replica with the fewest outstanding tokens
(prompt + max_new_tokens of its unfinished requests), then the fewest requests. Per replica, a sender
thread writes batched commands to its pipe (the event loop never blocks on a slow replica) and a
reader thread hands each step's results to the loop with one call_soon_threadsafe. A replica that
exits fails its in-flight requests with ReplicaDiedError; the others go on.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Self

from gptoss.async_engine import AsyncEngine, _Stream
from gptoss.dp_replica import Failure, replica_main
from gptoss.engine import Delta, EngineConfig, EngineError, check_prompt
from gptoss.lora_spec import split_lora_spec
from gptoss.sampling import SamplingParams

STOP_TIMEOUT_S = 30.0  # a replica finishes its step and exits; past this it is killed
_STOP = None  # the sender thread's sentinel: send ("stop",) and end


class ReplicaDiedError(EngineError):
    """A replica process exited with this request in flight (killed, out of memory, crashed)."""


class ReplicaStartError(RuntimeError):
    """A replica could not start; the message names the replica, its device and the cause."""


def open_engine(config: EngineConfig) -> AsyncEngine | DPEngine:
    """The engine `config` asks for: one replica in this process, or DPEngine's processes."""
    if config.num_replicas > 1:
        return DPEngine(config)
    import torch  # the engine needs it anyway; is_available() creates no CUDA context to fork past

    return DPEngine(config) if config.own_process(torch.cuda.is_available()) else AsyncEngine(config)


@dataclass(eq=False, slots=True)
class _Replica:
    index: int
    device: str
    process: BaseProcess
    inbox: Connection  # parent -> replica
    outbox: Connection  # replica -> parent
    sends: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    requests: int = 0  # outstanding
    tokens: int = 0  # outstanding prompt + max_new_tokens
    assigned: int = 0  # requests ever sent here
    alive: bool = True  # until its death is handled on the loop
    info: dict[str, Any] = field(default_factory=dict)
    threads: list[threading.Thread] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    @property
    def name(self) -> str:
        return f"replica {self.index} on {self.device} (pid {self.process.pid})"


class DPEngine:
    """AsyncEngine's interface (async with, generate, abort, info) over N replica processes."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.max_model_len = 0  # known once every replica is ready
        self.vocab_size = 0
        self._replicas: list[_Replica] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running = False
        self._stopping = False
        self._deaths: list[str] = []
        self._owner: dict[str, tuple[_Replica, int]] = {}  # rid -> (its replica, its token cost)
        self._streams: weakref.WeakValueDictionary[str, _Stream] = weakref.WeakValueDictionary()
        self._ids = itertools.count()
        self._numbers = itertools.count()  # as one engine numbers its requests (the unseeded ones' seeds)

    @property
    def num_replicas(self) -> int:
        return len(self._replicas) or self.config.num_replicas

    @property
    def pids(self) -> list[int]:
        return [r.process.pid for r in self._replicas]

    # ---- start and stop ---------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        self._loop = asyncio.get_running_loop()
        has_cuda = False
        if self.config.device is None and self.config.devices is None:
            import torch

            has_cuda = torch.cuda.is_available()
        devices = self.config.replica_devices(has_cuda)
        threads = max(1, len(os.sched_getaffinity(0)) // len(devices))
        ctx = multiprocessing.get_context("spawn")  # CUDA cannot be forked; each replica starts clean
        one = replace(self.config, data_parallel_size=1, devices=None)
        ready: list[asyncio.Future[dict]] = []
        try:
            for i, device in enumerate(devices):
                # Started on the loop's thread: PR_SET_PDEATHSIG fires when the starting thread exits.
                ready.append(self._start(ctx, i, device, replace(one, device=device), threads))
            await self._await_ready(ready)
            if self._deaths:  # a replica was ready, then gone before the others were
                raise ReplicaStartError(f"{self._deaths[0]} during start-up")
        except BaseException:
            self._stopping = True
            for f in ready:  # the failures not reported are retrieved or cancelled: no asyncio warnings
                _ = f.exception() if f.done() and not f.cancelled() else f.cancel()
            await asyncio.to_thread(self._reap, 0.0)
            raise
        self.max_model_len = min(r.info["max_model_len"] for r in self._replicas)
        self.vocab_size = self._replicas[0].info["vocab_size"]
        self._running = True
        return self

    def _start(self, ctx, index: int, device: str, config: EngineConfig, threads: int) -> asyncio.Future:
        their_inbox, inbox = ctx.Pipe(duplex=False)
        outbox, their_outbox = ctx.Pipe(duplex=False)
        process = ctx.Process(
            target=replica_main,
            args=(index, config, their_inbox, their_outbox, os.getpid(), threads),
            name=f"gptoss-replica-{index}",
            daemon=True,
        )
        process.start()
        _LIVE.add(process)
        their_inbox.close()  # only the replica holds these now: its exit is our reader's EOF
        their_outbox.close()
        rep = _Replica(index, device, process, inbox, outbox)
        self._replicas.append(rep)
        future = self._loop.create_future()
        rep.threads = [
            threading.Thread(target=self._send, args=(rep,), name=f"dp-send-{index}", daemon=True),
            threading.Thread(target=self._read, args=(rep, future), name=f"dp-read-{index}", daemon=True),
        ]
        for t in rep.threads:
            t.start()
        return future

    async def _await_ready(self, ready: list[asyncio.Future]) -> None:
        """Wait for every replica; the first that fails stops the start (the others are killed)."""
        pending = set(ready)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
            errors = [f.exception() for f in ready if f.done() and f.exception() is not None]
            if errors:
                more = f" ({len(errors) - 1} other replica(s) failed too)" if len(errors) > 1 else ""
                raise ReplicaStartError(f"{errors[0]}{more}")

    async def __aexit__(self, *exc: object) -> None:
        self._stopping = True
        self._running = False
        for rep in self._replicas:
            rep.sends.put(_STOP)
        await asyncio.to_thread(self._reap, STOP_TIMEOUT_S)
        for rid in list(self._streams):
            self._fail(rid, EngineError("the engine was shut down with this request in flight"))

    def _reap(self, timeout: float) -> None:
        """Join every replica within `timeout` s, kill the rest, and join our threads."""
        deadline = time.monotonic() + timeout
        for rep in self._replicas:
            rep.process.join(max(0.0, deadline - time.monotonic()))
        for rep in self._replicas:
            if rep.process.is_alive():
                rep.process.kill()
            rep.process.join()
            _LIVE.discard(rep.process)
            rep.sends.put(_STOP)
            for t in rep.threads:
                t.join()
            rep.inbox.close()
            rep.outbox.close()

    def adapters(self) -> dict[str, str]:
        """The LoRA adapters each replica loaded: name -> folder."""
        return dict(split_lora_spec(spec) for spec in self.config.lora)

    def info(self) -> dict[str, object]:
        """Replica 0's sizes, the smallest max_model_len, and every replica's own (for run.json)."""
        if not self._replicas or not self._replicas[0].info:
            return {}
        shared = {k: v for k, v in self._replicas[0].info.items() if k not in _PER_REPLICA}
        return shared | {
            "device": ",".join(r.device for r in self._replicas),
            "data_parallel_size": len(self._replicas),
            "max_model_len": self.max_model_len,
            "replicas": [{k: r.info.get(k) for k in _PER_REPLICA} for r in self._replicas],
        }

    # ---- requests (event loop) ----------------------------------------------------------------

    def generate(
        self,
        prompt: list[int],
        params: SamplingParams,
        request_id: str | None = None,
        final_only: bool = False,
        lora: str | None = None,
    ) -> _Stream:
        """Queue a request on the least-loaded live replica; iterate the result for its Deltas.
        `lora` names an adapter every replica loaded (--lora)."""
        if not self._running:
            raise RuntimeError("the engine is not running: use `async with open_engine(config) as engine`")
        live = [r for r in self._replicas if r.alive]
        if not live:
            raise ReplicaDiedError(f"every replica died; the first: {self._deaths[0]}")
        check_prompt(prompt, self.max_model_len, self.vocab_size)
        if lora is not None and lora not in self.adapters():
            raise ValueError(
                f"LoRA adapter {lora!r} is not loaded (loaded: {sorted(self.adapters()) or 'none'})"
            )
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        if rid in self._streams or rid in self._owner:
            raise ValueError(f"request id {rid!r} is already in flight")
        rep = min(live, key=lambda r: (r.tokens, r.requests, r.index))
        cost = len(prompt) + params.max_new_tokens
        rep.requests, rep.tokens, rep.assigned = rep.requests + 1, rep.tokens + cost, rep.assigned + 1
        self._owner[rid] = (rep, cost)
        stream = _Stream(self, rid, final_only)
        self._streams[rid] = stream
        rep.sends.put(("add", rid, list(prompt), params, final_only, lora, next(self._numbers)))
        return stream

    def abort(self, request_id: str) -> None:
        """Stop a request; its iterator ends with finish_reason "abort". Safe from any thread."""
        owner = self._owner.get(request_id)
        if owner is not None:
            owner[0].sends.put(("abort", request_id))

    def _deliver(self, items: list[tuple[str, Delta | Failure]]) -> None:
        for rid, item in items:
            got = item.error() if isinstance(item, Failure) else item
            if isinstance(got, BaseException) or got.finish_reason is not None:
                self._release(rid)
            stream = self._streams.get(rid)
            if stream is not None:
                stream._push(got)

    def _release(self, rid: str) -> None:
        owner = self._owner.pop(rid, None)
        if owner is not None:
            rep, cost = owner
            rep.requests, rep.tokens = rep.requests - 1, rep.tokens - cost

    def _fail(self, rid: str, error: BaseException) -> None:
        self._release(rid)
        stream = self._streams.get(rid)
        if stream is not None and not stream._closed:
            stream._push(error)

    def _started(self, rep: _Replica, future: asyncio.Future, message: tuple) -> None:
        if message[0] == "ready":
            rep.info = message[1] | {"ready_s": round(time.monotonic() - rep.started, 1)}
            i = rep.info
            print(
                f"gptoss: {rep.name} ready in {i['ready_s']:.1f} s: max_model_len {i['max_model_len']}, "
                f"kv_cache_tokens {i['kv_cache_tokens']} ({i['kv_max_seqs']} such sequences at once)",
                file=sys.stderr,
                flush=True,
            )
            future.set_result(rep.info)
        elif not future.done():
            future.set_exception(ReplicaStartError(f"{rep.name} failed to start: {message[1]}"))

    def _died(self, rep: _Replica, exitcode: int | None) -> None:
        if not rep.alive or self._stopping:
            return
        rep.alive = False
        message = f"{rep.name} died: {_exit_reason(exitcode)}"
        self._deaths.append(message)
        if not self._running:  # during start-up: __aenter__ reports it
            return
        failed = [rid for rid, (owner, _) in self._owner.items() if owner is rep]
        for rid in failed:
            self._fail(rid, ReplicaDiedError(message))
        live = sum(r.alive for r in self._replicas)
        print(
            f"gptoss: {message}; its {len(failed)} requests in flight failed, {live} replicas go on",
            file=sys.stderr,
            flush=True,
        )

    # ---- per-replica threads ----------------------------------------------------------------

    def _send(self, rep: _Replica) -> None:
        """Batch whatever queued up into one message (Offline hands over thousands at once)."""
        while True:
            batch = [rep.sends.get()]
            while batch[-1] is not _STOP:
                try:
                    batch.append(rep.sends.get_nowait())
                except queue.Empty:
                    break
            stop = batch[-1] is _STOP
            commands = [c for c in batch if c is not _STOP] + ([("stop",)] if stop else [])
            try:
                rep.inbox.send(commands)
            except OSError:  # the replica is gone; its reader reports it
                return
            if stop:
                return

    def _read(self, rep: _Replica, ready: asyncio.Future) -> None:
        call = self._loop.call_soon_threadsafe
        try:
            call(self._started, rep, ready, rep.outbox.recv())
            while True:
                call(self._deliver, rep.outbox.recv())
        except (EOFError, OSError):  # noqa: S110 - the replica exited: its exit reason is reported below
            pass
        except RuntimeError:  # the loop is closed: nobody is listening any more
            if self._loop.is_closed():
                return
            raise  # any other RuntimeError is a bug: not hidden as a closed loop
        rep.process.join(5.0)
        if not ready.done():
            reason = _exit_reason(rep.process.exitcode)
            error = ReplicaStartError(f"{rep.name} failed to start: it exited ({reason}); see its stderr")
            call(lambda: ready.done() or ready.set_exception(error))
        call(self._died, rep, rep.process.exitcode)


_PER_REPLICA = (
    "device",
    "pid",
    "ready_s",
    "max_model_len",
    "kv_cache_tokens",
    "kv_ring_blocks",
    "kv_max_seqs",
)


def _exit_reason(exitcode: int | None) -> str:
    if exitcode is None:
        return "its pipe closed while it still runs"
    if exitcode < 0:
        return f"killed by {signal.Signals(-exitcode).name} (exit code {exitcode})"
    return f"exit code {exitcode}"


# Replicas still running when the interpreter exits (no __aexit__: an error, sys.exit) are killed.
_LIVE: set[BaseProcess] = set()


@atexit.register
def _kill_live() -> None:
    for process in list(_LIVE):
        if process.is_alive():
            process.kill()
        process.join(5.0)

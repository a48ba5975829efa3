"""One data-parallel engine replica: the child process that gptoss.dp_engine.DPEngine spawns per device.

It owns one LLMEngine and talks to the parent over two one-way pipes. In: lists of commands,
("add", rid, prompt, params, final_only, number), ("abort", rid) or ("stop",). Out: first ("ready",
info) or ("failed", "Type: message"), then one list of (rid, Delta | Failure) per engine step that
produced anything.

The parent owns the replica's lifetime: SIGINT and SIGTERM (sent to the whole process group by a
terminal or a supervisor) are ignored here, so the parent can drain and stop replicas itself; the
kernel kills the replica when the parent dies (PR_SET_PDEATHSIG), and a parent that is gone
without saying "stop" (its pipe at EOF) ends it too.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection

from gptoss.engine import Delta, EngineConfig, EngineError

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@dataclass(frozen=True, slots=True)
class Failure:
    """A request's error, sent as text (an exception's __cause__ does not survive pickling)."""

    kind: str  # "refused": the engine would not add it (ValueError); "engine": a step failed
    message: str

    def error(self) -> Exception:
        return ValueError(self.message) if self.kind == "refused" else EngineError(self.message)


def replica_main(
    index: int, config: EngineConfig, inbox: Connection, outbox: Connection, parent_pid: int, threads: int
) -> None:
    """The spawned process's target: load the engine, say ready (or why not), serve until "stop"."""
    _tie_to_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        device = _pin_gpu(config.device)
        import torch  # after _pin_gpu: CUDA reads CUDA_VISIBLE_DEVICES when torch first touches it

        from gptoss.engine import LLMEngine

        torch.set_num_threads(threads)
        core = LLMEngine(replace(config, device=device))
    except BaseException as e:  # noqa: BLE001
        # one line for the parent's error message; no traceback on stderr
        outbox.send(("failed", f"{type(e).__name__}: {e}"))
        sys.exit(1)
    info = core.info() | {
        "device": config.device,
        "pid": os.getpid(),
        "vocab_size": core.vocab_size,
    }
    outbox.send(("ready", info))
    try:
        _Replica(core, inbox, outbox).run()
    except Exception as e:  # a bug in the loop: fail what is in flight, then exit non-zero, loudly
        message = f"the replica's engine loop failed: {type(e).__name__}: {e}"
        outbox.send([(rid, Failure("engine", message)) for rid in core.fail_all()])
        raise


def _tie_to_parent(parent_pid: int) -> None:
    """Die with the parent, even one killed by SIGKILL (Linux; elsewhere the pipe's EOF does it)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _pin_gpu(device: str) -> str:
    """cuda:N -> this process sees only GPU N, as cuda:0: its CUDA context, Triton's launches and the
    CUDA graphs all stay on that GPU, and no context is made on the others."""
    kind, _, index = device.partition(":")
    if kind != "cuda" or not index:
        return device
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",")] if visible else None
    if ids is not None and int(index) >= len(ids):
        raise ValueError(f"{device}: CUDA_VISIBLE_DEVICES={visible} lists {len(ids)} GPUs")
    os.environ["CUDA_VISIBLE_DEVICES"] = ids[int(index)] if ids is not None else index
    return "cuda:0"


class _Replica:
    """A receiver thread fills the inbox; this thread runs the engine as AsyncEngine's thread does."""

    def __init__(self, core, inbox: Connection, outbox: Connection) -> None:
        self.core = core
        self.inbox = inbox
        self.outbox = outbox
        self.cond = threading.Condition()
        self.commands: list[tuple] = []  # guarded by cond
        self.stopping = False
        # final_only requests: their tokens so far, sent once, at the end (one pickle, not one a step).
        self.held: dict[str, list[int]] = {}

    def run(self) -> None:
        threading.Thread(target=self._receive, name="replica-inbox", daemon=True).start()
        core = self.core
        while True:
            with self.cond:
                while not (self.commands or self.stopping or core.has_work()):
                    self.cond.wait()
                if self.stopping:
                    return
                commands, self.commands = self.commands, []
            out: list[tuple[str, Delta | Failure]] = []
            for command in commands:
                self._apply(command, out)
            try:
                step = core.step()
            except Exception as e:  # noqa: BLE001 - each request in flight fails with it, named
                failed = core.fail_all()
                message = f"engine step failed: {type(e).__name__}: {e}"
                for rid in failed:
                    out += self._flush(rid)
                    out.append((rid, Failure("engine", message)))
                step = []
            for rid, delta in step:
                out += self._hold(rid, delta)
            if out:
                self.outbox.send(out)

    def _apply(self, command: tuple, out: list) -> None:
        if command[0] == "add":
            _, rid, prompt, params, final_only, lora, number = command
            try:
                self.core.add(rid, prompt, params, lora, number)
            except ValueError as e:
                out.append((rid, Failure("refused", str(e))))
                return
            if final_only:
                self.held[rid] = []
        elif command[0] == "abort" and self.core.abort(command[1]):
            out.append((command[1], Delta(self.held.pop(command[1], []), "abort")))

    def _hold(self, rid: str, delta: Delta) -> list[tuple[str, Delta]]:
        held = self.held.get(rid)
        if held is None:
            return [(rid, delta)]
        held += delta.token_ids
        if delta.finish_reason is None:
            return []
        del self.held[rid]
        return [(rid, Delta(held, delta.finish_reason, delta.stop_token_id))]

    def _flush(self, rid: str) -> list[tuple[str, Delta]]:
        """A failing final_only request still hands over the tokens it had (never invented ones)."""
        held = self.held.pop(rid, None)
        return [(rid, Delta(held, None))] if held else []

    def _receive(self) -> None:
        while True:
            try:
                commands = self.inbox.recv()
            except (EOFError, OSError):  # the parent is gone without a "stop": nobody reads our output
                os._exit(1)
            with self.cond:
                for command in commands:
                    if command[0] == "stop":
                        self.stopping = True
                    else:
                        self.commands.append(command)
                self.cond.notify()
            if self.stopping:
                return

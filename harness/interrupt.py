"""Ctrl-C (SIGINT) and SIGTERM while LoadGen's StartTest blocks the main thread.

StartTest runs in C++ on the main thread, so a Python signal handler would only run when LoadGen
next calls into Python, and raising KeyboardInterrupt inside a LoadGen callback would abort the
process. Instead the signal reaches the loop thread through signal.set_wakeup_fd: the first one
cancels the outstanding queries (the SUT completes them with what they have) and completes new
ones at once, so LoadGen can finish and write its logs. LoadGen has no abort call: in Server mode
it keeps issuing queries on its schedule, so after a grace period (or a second Ctrl-C) the
process exits without waiting for it, once our own outputs are written.
"""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Callable
from typing import Self

from harness.loop import LoopThread

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class InterruptWatcher:
    def __init__(
        self,
        loop: LoopThread,
        on_interrupt: Callable[[int], None],
        on_give_up: Callable[[int], None],
        grace_s: float,
    ) -> None:
        """on_interrupt(signum) and on_give_up(signum) run on the loop thread; on_give_up must not return."""
        self._loop = loop
        self._on_interrupt = on_interrupt
        self._on_give_up = on_give_up
        self._grace_s = grace_s
        self.signum: int | None = None
        self._count = 0
        self._timer = None

    def __enter__(self) -> Self:
        # Signal handlers can only be set from the main thread; a run started elsewhere (an
        # embedding program) leaves signals to that program.
        self._active = threading.current_thread() is threading.main_thread()
        if not self._active:
            return self
        self._rsock, self._wsock = socket.socketpair()
        self._rsock.setblocking(False)
        self._wsock.setblocking(False)
        # The Python-level handlers do nothing: the wakeup fd carries the signal to the loop.
        self._old_handlers = {s: signal.signal(s, self._ignore) for s in SIGNALS}
        self._old_fd = signal.set_wakeup_fd(self._wsock.fileno(), warn_on_full_buffer=False)
        self._loop.run(self._add_reader())
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._active:
            return
        self._loop.run(self._remove_reader())
        signal.set_wakeup_fd(self._old_fd)
        for s, handler in self._old_handlers.items():
            signal.signal(s, handler)
        self._rsock.close()
        self._wsock.close()

    @staticmethod
    def _ignore(signum: int, frame: object) -> None:
        pass

    async def _add_reader(self) -> None:
        self._loop.loop.add_reader(self._rsock.fileno(), self._on_readable)

    async def _remove_reader(self) -> None:
        self._loop.loop.remove_reader(self._rsock.fileno())
        if self._timer is not None:
            self._timer.cancel()

    def _on_readable(self) -> None:
        try:
            data = self._rsock.recv(64)
        except BlockingIOError:  # a spurious wake-up: nothing to read, so no signal is lost
            return
        for signum in data:
            if signum not in SIGNALS:
                continue
            self._count += 1
            if self._count == 1:
                self.signum = signum
                self._on_interrupt(signum)
                self._timer = self._loop.loop.call_later(self._grace_s, self._on_give_up, signum)
            else:
                self._on_give_up(self.signum or signum)

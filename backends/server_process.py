"""A server run as a child process: its own session, output to a log file, ready when an HTTP URL
answers 200, and stopped with everything it started (SIGTERM to its process group, then SIGKILL).

The child leads a new session, so a Ctrl-C at the terminal reaches only the harness, which then
stops the child itself once its queries are done. Three nets make sure nothing outlives the
harness: stop() on every normal and error path, an atexit hook for an interpreter that exits
without it (Ctrl-C while the server starts), and, on Linux, PR_SET_PDEATHSIG, so the server gets
SIGTERM even when the harness dies without running Python code (os._exit after a second Ctrl-C,
SIGKILL).
"""

from __future__ import annotations

import asyncio
import atexit
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from backends.base import BackendError

READY_POLL_S = 0.5
PROGRESS_S = 30.0  # a line on stderr this often while the server starts
STOP_GRACE_S = 30.0  # after SIGTERM, before SIGKILL (vLLM shuts its engine and workers down in a few s)
KILL_WAIT_S = 5.0
TAIL_LINES = 12
MAX_ERRORS = 8
# The last line of a traceback, bare or after a logger's "[file.py:123] " prefix: where vLLM's
# root cause (in an engine or worker process) is, far above the server's own final traceback.
_ERROR_LINE = re.compile(r"(?:^|\] )((?:[A-Za-z_][\w.]*)?(?:Error|Exception): .*)$")

# Runs first in the child, then becomes the server (execv keeps the pid, the session and the death
# signal). The signal is tied to the thread that forked: the harness's loop thread, which lives as
# long as the process. argv: parent pid, then the server's command.
_DEATH_SIGNAL = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit('the harness exited before its server started')\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


class ServerStartError(BackendError):
    """The server exited, or did not get ready in time, before it served anything."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on now (the server binds it a moment later: a race only another
    process taking the same port in between can lose)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group `pgid`."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # noqa: S112 - the process exited between scandir and open: not in the group any more
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp ...
        if int(fields[2]) == pgid and fields[0] != b"Z":
            found.append(int(entry.name))
    return found


def _group_alive(pgid: int) -> bool:
    if sys.platform == "linux":
        return bool(group_members(pgid))
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:  # the answer itself: no process of the group is left
        return False
    return True


class ServerProcess:
    def __init__(
        self, what: str, command: list[str], log_path: Path, env: Mapping[str, str] | None = None
    ) -> None:
        self.what = what  # the server's name in messages: "vLLM's server"
        self.command = command
        self.log_path = log_path
        self._env = dict(os.environ if env is None else env)
        self._proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        """The exit code once it has exited (negative: killed by that signal), else None."""
        return self._proc.poll() if self._proc is not None else None

    def start(self) -> None:
        argv = self.command
        if sys.platform == "linux":
            argv = [sys.executable, "-c", _DEATH_SIGNAL, str(os.getpid()), *argv]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._env | {"PYTHONUNBUFFERED": "1"},  # its log is current when we quote it
                start_new_session=True,  # its own process group: stop() reaches all it starts
            )
        atexit.register(self._kill_now)

    def _log_text(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - (1 << 20)))
                return f.read().decode("utf-8", "replace")
        except OSError as e:
            return f"(cannot read {self.log_path}: {e.strerror or e})"

    def _failure(self, what_happened: str) -> ServerStartError:
        """What happened, the exception lines of its log (each once, in order), and its last lines."""
        lines = self._log_text().splitlines()
        errors = list(dict.fromkeys(m.group(1) for line in lines if (m := _ERROR_LINE.search(line))))
        found = "its errors:\n" + "\n".join(errors[:MAX_ERRORS]) + "\n" if errors else ""
        return ServerStartError(
            f"{self.what} {what_happened} (log: {self.log_path}); {found}its last lines:\n"
            + "\n".join(lines[-TAIL_LINES:])
        )

    async def wait_ready(self, url: str, timeout_s: float, hint: str) -> float:
        """Poll GET `url` until it answers 200; the seconds it took. Fails (and stops the server)
        if the server exits first or `timeout_s` passes; `hint` names the flag that sets it."""
        import aiohttp

        start = time.monotonic()
        next_progress = start + PROGRESS_S
        probe = aiohttp.ClientTimeout(total=5.0)
        failed, last = 0, "none answered"  # the probes that got no 200, and the last one's outcome
        async with aiohttp.ClientSession() as session:
            while True:
                code = self.returncode
                if code is not None:
                    await self.stop()  # what it started may still run
                    raise self._failure(f"exited with code {code} while starting")
                try:
                    async with session.get(url, timeout=probe) as resp:
                        if resp.status == 200:
                            return time.monotonic() - start
                        failed, last = failed + 1, f"HTTP {resp.status}"
                except (TimeoutError, aiohttp.ClientError) as e:  # not listening yet, or busy loading
                    failed, last = failed + 1, f"{type(e).__name__}: {e}"
                now = time.monotonic()
                if now - start >= timeout_s:
                    await self.stop()
                    raise self._failure(
                        f"did not answer GET {url} within {timeout_s:g} s ({hint}); stopped it "
                        f"after {failed} failed probes, the last: {last}"
                    )
                if now >= next_progress:
                    print(
                        f"waiting for {self.what} (pid {self.pid}, {now - start:.0f} s of {hint} "
                        f"{timeout_s:g}; log: {self.log_path})",
                        file=sys.stderr,
                        flush=True,
                    )
                    next_progress = now + PROGRESS_S
                await asyncio.sleep(READY_POLL_S)

    async def exited(self, within_s: float) -> int | None:
        """The exit code if the server exits within `within_s` seconds, else None. A dropped
        connection arrives a moment before the kernel reports the exit."""
        deadline = time.monotonic() + within_s
        while (code := self.returncode) is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return code

    async def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM to the whole group, up to `grace_s` for it to exit, then SIGKILL."""
        if self._proc is None:
            return
        pgid = self._proc.pid  # the session leader's pid is its group's id
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, KILL_WAIT_S)):
            if not self._signal(pgid, sig):
                break
            deadline = time.monotonic() + wait_s
            while self._alive(pgid) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            if not self._alive(pgid):
                break
        if self._proc.poll() is None:  # the group looked empty a moment before the leader could be reaped
            await asyncio.to_thread(self._proc.wait, KILL_WAIT_S)  # a leader that never ends raises
        atexit.unregister(self._kill_now)

    def _kill_now(self) -> None:
        """stop() for atexit, where no loop runs."""
        if self._proc is None:
            return
        pgid = self._proc.pid
        for sig, wait_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, KILL_WAIT_S)):
            if not self._signal(pgid, sig):
                return
            deadline = time.monotonic() + wait_s
            while self._alive(pgid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if not self._alive(pgid):
                return

    def _alive(self, pgid: int) -> bool:
        self._proc.poll()  # reaps the leader, which would otherwise stay a zombie in the group
        return _group_alive(pgid)

    @staticmethod
    def _signal(pgid: int, sig: signal.Signals) -> bool:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return False  # nothing left in the group
        return True

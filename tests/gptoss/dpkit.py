"""Process checks shared by the data-parallel tests."""

from __future__ import annotations

import time

import psutil


def gone(pids: list[int], within: float = 10.0) -> bool:
    """Every pid has exited (a zombie counts: its reaper may be a container's init)."""
    deadline = time.monotonic() + within
    while [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True

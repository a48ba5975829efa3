"""Seconds of each phase of an engine's start-up, for engine.info() and the bench's start-up row.

Why. A cold start-up (an empty Triton cache) took 44-54 s for the random 20b on an H200 against 18 s
on a kept cache (bench/results v53), with the precompile's wait and the warm-up down to ~2 s between
them: the rest is spread over loading, repacking, capturing graphs, and the precompile's threads
competing with them for the CPU. Each phase's time says which one the cold start stretches.
"""

from __future__ import annotations

import time

import torch


class StartupClock:
    """Laps of a start-up: lap(name) ends the phase begun at the previous lap (or at construction)
    once the device has finished the work queued in it, so an asynchronous copy or a capture counts
    in the phase that issued it, not in the next one to synchronize."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seconds: dict[str, float] = {}
        self._t = time.perf_counter()

    def lap(self, phase: str) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.seconds[phase] = round(self.seconds.get(phase, 0.0) + now - self._t, 3)
        self._t = now

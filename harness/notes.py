"""Notes a Server/Interactive run prints before it starts: measured ways its latencies mislead."""

from __future__ import annotations

from typing import Any

WARMUP_NOTE = (
    "no --warmup: the first queries' TTFT includes the engine's one-off compiles and captures (vLLM on "
    "an H100 at 4 QPS: TTFT p99 5.0 s without, 1.1 s with --warmup 64)"
)
# Measured on an H100 (bench/results/2026-11-22_gptoss_gpu.md, v10): at 8 QPS, TPOT p99 108-141 ms in
# process against 55 ms for the same vLLM as its own server through --backend openai.
VLLM_LATENCY_NOTE = (
    "--vllm-process inline runs vLLM's output handling in this process, which shares one interpreter "
    "with LoadGen and the SUT: its Server/Interactive latencies come out longer than vLLM's own (TPOT "
    "p99 about 2x on an H100). For latency figures leave --vllm-process at its default, server "
    "(README, vLLM)"
)


def latency_notes(
    backend: str, scenario: str, options: Any, *, accuracy: bool, warmup: int, sweep: bool
) -> list[str]:
    """The notes for a run of `backend` (its parsed `options`) in `scenario` (none for Offline)."""
    if scenario == "offline":
        return []
    inline = backend == "vllm" and options.resolved_process(scenario) == "inline"
    notes = [VLLM_LATENCY_NOTE] if inline else []
    if not accuracy and warmup == 0 and not sweep:
        notes.append(WARMUP_NOTE)
    return notes

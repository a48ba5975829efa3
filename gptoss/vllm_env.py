"""The plugin's contract with vLLM's processes: the environment variables that switch our MoE on
(the only channel into processes vLLM starts), their checks, and the per-process build reports.
Standard library only: gptoss.vllm_plugin (imported by vLLM in every process) and gptoss.vllm_moe
(our MoE inside vLLM) both read it."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ENV = "GPTOSS_VLLM_MOE"
MAX_TOKENS_ENV = "GPTOSS_VLLM_MOE_MAX_TOKENS"
REPORT_ENV = "GPTOSS_VLLM_MOE_REPORT"
MODES = ("vllm", "gptoss")


class VllmPluginError(RuntimeError):
    """The plugin cannot run as asked: an untested vLLM, a bad setting, or it is not installed."""


def mode(environ: Mapping[str, str] = os.environ) -> str:
    value = environ.get(ENV, "vllm").strip().lower() or "vllm"
    if value not in MODES:
        raise VllmPluginError(f"{ENV}={environ[ENV]!r}: expected one of {', '.join(MODES)}")
    return value


def max_tokens(environ: Mapping[str, str] = os.environ) -> int | None:
    raw = environ.get(MAX_TOKENS_ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise VllmPluginError(f"{MAX_TOKENS_ENV}={raw!r}: expected a positive token count")
    return int(raw)


def environment(moe: str, max_tokens: int | None, report_dir: Path | None) -> dict[str, str]:
    """The variables that make vLLM's processes run `moe` ("vllm" | "gptoss")."""
    if moe not in MODES:
        raise VllmPluginError(f"moe must be one of {', '.join(MODES)}, got {moe!r}")
    env = {ENV: moe, MAX_TOKENS_ENV: "" if max_tokens is None else str(max_tokens)}
    env[REPORT_ENV] = str(report_dir) if report_dir is not None else ""
    return env


def write_report(record: dict[str, Any]) -> None:
    """One file per process that built our MoE, rewritten as its layers load (GPTOSS_VLLM_MOE_REPORT)."""
    folder = os.environ.get(REPORT_ENV)
    if not folder:
        return
    path = Path(folder) / f"moe-{os.getpid()}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)  # a reader never sees half a file


def read_reports(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(Path(folder).glob("moe-*.json"))]

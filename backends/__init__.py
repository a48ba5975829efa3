"""Backend registry. Backend modules import their heavy libraries lazily, inside create()."""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from types import ModuleType

from backends.base import Backend

NAMES = ("gptoss", "vllm", "sglang", "openai")
DEFAULT = "gptoss"


@dataclass(frozen=True, slots=True)
class Spec:
    module: str  # defines create(cfg: RunSpec) -> Backend
    cls: str  # the Backend class in that module (its name, flags, in_process ...)
    needs: tuple[str, ...]  # importable modules the backend cannot run without
    install: str  # the setup.sh call that installs them


SPECS: dict[str, Spec] = {
    "gptoss": Spec(
        "backends.gptoss", "GptossBackend", ("torch", "safetensors"), "./setup.sh --backend gptoss"
    ),
    "vllm": Spec("backends.vllm", "VllmBackend", ("vllm",), "./setup.sh --backend vllm"),
    "sglang": Spec("backends.sglang", "SglangBackend", ("aiohttp",), "./setup.sh --backend sglang"),
    "openai": Spec("backends.openai", "OpenAIBackend", ("aiohttp",), "./setup.sh --backend openai"),
}


class BackendNotInstalled(RuntimeError):
    pass


def check_installed(name: str) -> None:
    spec = SPECS[name]
    missing = [m for m in spec.needs if importlib.util.find_spec(m) is None]
    if missing:
        raise BackendNotInstalled(
            f"backend '{name}' needs {', '.join(missing)}, which is not installed: run `{spec.install}`"
        )


def _spec(name: str) -> Spec:
    if name not in SPECS:
        raise ValueError(f"unknown backend '{name}'; choose one of {', '.join(NAMES)}")
    return SPECS[name]


def module(name: str) -> ModuleType:
    """The module whose create(cfg) builds the backend."""
    return importlib.import_module(_spec(name).module)


def backend_class(name: str) -> type[Backend]:
    """The backend's class: its flags (Options), in_process, default_model_path()."""
    spec = _spec(name)
    return getattr(importlib.import_module(spec.module), spec.cls)

"""Kernel tests run compiled on a GPU and in Triton's interpreter elsewhere (set before triton loads)."""

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ.setdefault(
        "TRITON_INTERPRET", "1"
    )  # tests/conftest.py sets it first; this keeps the folder standalone


# The engine tests' model is the tiny one cut down for the interpreter, where a decode step of the
# tiny checkpoint took ~17 s. The real vocabulary (201088) made the sampling kernel a third of each
# step, and a kernel test's tokens do not depend on it: 6000 still spans three sampling chunks at
# batch 1 (2048 each, the last partial), so the chunk merge runs. Two layers are one sliding-window
# and one full-attention layer, every kind the tiny model has, at half its kernel launches.
VOCAB = 6000
LAYERS = 2


@pytest.fixture(scope="session")
def kernel_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with VOCAB tokens and LAYERS layers: the checkpoint the engine tests of this
    folder run, Triton kernels against the torch reference."""
    from tests.conftest import make_tiny

    return make_tiny(tmp_path_factory.mktemp("gptoss") / "tiny-cut", layers=LAYERS, vocab_size=VOCAB)


@pytest.fixture(scope="session")
def kernel_loras(kernel_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """tests/conftest.py's make_loras adapters for kernel_checkpoint."""
    from tests.conftest import make_loras

    return make_loras(kernel_checkpoint, tmp_path_factory.mktemp("kernel-lora"))


def count_calls(monkeypatch, targets) -> dict[str, int]:
    """Wraps each (module, function name, key) so calls count under key; returns the counts."""
    calls = dict.fromkeys((key for _, _, key in targets), 0)
    for owner, name, key in targets:
        fn = getattr(owner, name)

        def counted(*a, _fn=fn, _key=key, **kw):
            calls[_key] += 1
            return _fn(*a, **kw)

        monkeypatch.setattr(owner, name, counted)
    return calls


def record_flag(monkeypatch, owner, name: str, flag: str) -> list[bool]:
    """Wraps owner.name so each call appends its keyword `flag` (False when not passed); returns the list."""
    seen: list[bool] = []
    fn = getattr(owner, name)

    def recorded(*a, **kw):
        seen.append(kw.get(flag, False))
        return fn(*a, **kw)

    monkeypatch.setattr(owner, name, recorded)
    return seen


def sass_json(script: str) -> dict:
    """The --json output of a bench/kernels SASS script, run in a process without the interpreter
    (it compiles for sm_90a on CPU); once a pytest process, as several tests read one script's
    kernels (pdl_wait_sass.py: five), each its own copy."""
    return json.loads(_sass_output(script))


@functools.cache
def _sass_output(script: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve().parents[3] / "bench/kernels" / script), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=True,
    )
    return out.stdout


def record_launches(monkeypatch, owner, name: str, kwarg: str) -> list:
    """Wraps the Triton kernel owner.name so each launch (kernel[grid](...)) appends its keyword
    `kwarg`; returns the list."""
    kernel, seen = getattr(owner, name), []

    class Recorded:
        def __getitem__(self, grid):
            def launch(*a, **kw):
                seen.append(kw[kwarg])
                return kernel[grid](*a, **kw)

            return launch

    monkeypatch.setattr(owner, name, Recorded())
    return seen

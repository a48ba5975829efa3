"""Kernel tests run compiled on a GPU and in Triton's interpreter elsewhere (set before triton loads)."""

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ.setdefault(
        "TRITON_INTERPRET", "1"
    )  # tests/conftest.py sets it first; this keeps the folder standalone


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

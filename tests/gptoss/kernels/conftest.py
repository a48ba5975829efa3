"""Kernel tests run compiled on a GPU and in Triton's interpreter elsewhere (set before triton loads)."""

import os

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

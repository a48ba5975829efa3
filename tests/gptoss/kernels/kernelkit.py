"""What kernel test modules share: where they run (Triton's interpreter without CUDA or with
TRITON_INTERPRET=1, compiled on a GPU machine otherwise, as tests/conftest.py decides) and the mark
of the compiled-only tests."""

from __future__ import annotations

import os

import pytest
import torch

# Before anything imports triton. Only without CUDA, as the conftests do: on a GPU machine a module
# that set it after others had imported triton mixed interpreted and compiled kernels in one run
# (2026-11-28: "Cannot call @triton.jit'd outside of the scope of a kernel" in the engine test).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
DEV = "cpu" if INTERPRET else "cuda"
# The interpreter turns a runtime loop bound (a 1-element array) into an int with a NumPy deprecation.
INTERPRETER_WARNINGS = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0:DeprecationWarning"
)
gpu = pytest.mark.skipif(
    INTERPRET or not torch.cuda.is_available(), reason="needs CUDA and TRITON_INTERPRET=0"
)

"""What kernel test modules share: where they run (Triton's interpreter on CPU unless
TRITON_INTERPRET=0 on a GPU machine) and the mark of the compiled-only tests."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

import pytest
import torch

INTERPRET = os.environ["TRITON_INTERPRET"] == "1"
DEV = "cpu" if INTERPRET else "cuda"
# The interpreter turns a runtime loop bound (a 1-element array) into an int with a NumPy deprecation.
INTERPRETER_WARNINGS = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0:DeprecationWarning"
)
gpu = pytest.mark.skipif(
    INTERPRET or not torch.cuda.is_available(), reason="needs CUDA and TRITON_INTERPRET=0"
)

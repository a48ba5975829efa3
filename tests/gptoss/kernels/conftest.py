"""Kernel tests run compiled on a GPU and in Triton's interpreter elsewhere (set before triton loads)."""

import os

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ.setdefault(
        "TRITON_INTERPRET", "1"
    )  # tests/conftest.py sets it first; this keeps the folder standalone

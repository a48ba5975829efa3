"""bench/kernels/read_ceiling_gpu.py: its read kernel touches every word once, whatever the grid,
block and unroll (in Triton's interpreter on CPU), and the graph's calls cycle over the buffers."""

from __future__ import annotations

import functools
import operator
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "kernels"))

import read_ceiling_gpu as rc  # noqa: E402


@pytest.mark.parametrize(
    ("words", "block", "unroll", "grid"), [(10_000, 256, 4, 4), (1_000, 64, 8, 3), (37, 32, 2, 5)]
)
def test_the_read_kernel_xors_every_word_once(words, block, unroll, grid):
    x = torch.randint(
        -(2**31), 2**31 - 1, (words,), dtype=torch.int32, generator=torch.Generator().manual_seed(words)
    )
    out = torch.zeros(grid, dtype=torch.int32)
    rc._read_kernel[(grid,)](x, out, words, BLOCK=block, UNROLL=unroll)
    # a word read twice or skipped changes the XOR of all programs' results
    assert functools.reduce(operator.xor, out.tolist()) == functools.reduce(operator.xor, x.tolist())


def test_each_call_takes_the_next_buffer():
    seen: list[int] = []
    call = rc._cycle([10, 20, 30], seen.append)
    for _ in range(5):
        call()
    assert seen == [10, 20, 30, 10, 20]

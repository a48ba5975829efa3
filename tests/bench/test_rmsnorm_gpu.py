"""bench/kernels/rmsnorm_gpu.py on CPU (Triton's interpreter, untimed): its lists parse or say why
not, its ulp distance counts bf16 steps, and its rows name each launch, the peer, and how many rows
each launch gives bit for bit as the first."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "kernels"))

import rmsnorm_gpu  # noqa: E402

from gptoss.kernels import rmsnorm  # noqa: E402


def test_lists_parse_and_bad_ones_say_why():
    assert rmsnorm_gpu.parse_ints("1,64,8192") == [1, 64, 8192]
    with pytest.raises(argparse.ArgumentTypeError, match="comma list of integers"):
        rmsnorm_gpu.parse_ints("1,x")
    with pytest.raises(argparse.ArgumentTypeError, match=">= 1"):
        rmsnorm_gpu.parse_ints("4,0")


def test_ulp_steps_count_bf16_steps_across_zero():
    one = torch.tensor([[1.0, -2.0, 0.0]]).bfloat16()
    up = one.view(torch.int16).clone()
    up[0, 0] += 1  # the next bf16 above 1.0
    up[0, 1] += 3  # three steps further from zero below -2.0
    assert rmsnorm_gpu.ulp_steps(up.view(torch.bfloat16), one).tolist() == [3]
    assert rmsnorm_gpu.ulp_steps(
        torch.tensor([[-0.0]]).bfloat16(), torch.tensor([[0.0]]).bfloat16()
    ).tolist() == [0]
    tiny = torch.tensor([[-1e-40, 1e-40]]).bfloat16()  # one subnormal step each side of zero
    assert rmsnorm_gpu.ulp_steps(tiny, torch.zeros(1, 2).bfloat16()).tolist() == [
        int(tiny.view(torch.int16)[0, 1])
    ]


def test_rows_name_each_launch_and_leave_the_settings(monkeypatch):
    monkeypatch.setattr(rmsnorm_gpu, "timed_us", lambda fn, what: (fn(), 2.0)[1])
    before = rmsnorm.LARGE_T, rmsnorm.LARGE_WARPS
    rows = rmsnorm_gpu.t_rows(5, [16, 4], None, device="cpu", hidden=96)
    assert (rmsnorm.LARGE_T, rmsnorm.LARGE_WARPS) == before
    # hidden 96: a 128-wide block, one warp whatever is asked; the interpreter ignores warps anyway
    assert rows == [
        "| 5 | 1 warps | 2.0 | 1.00 | 5/5 | 0 |",
        "| 5 | 1 warps | 2.0 | 1.00 | 5/5 | 0 |",
        "| 5 | torch (add, rms_norm) | 2.0 | 1.00 | | |",
    ]

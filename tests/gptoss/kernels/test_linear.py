"""The GEMV projection (gptoss.kernels.linear) against F.linear: bf16 and float32, with and without
bias, odd N and K, and linear()'s choice between the kernel (CUDA, T <= GEMV_MAX_T) and F.linear.

Runs in Triton's interpreter without CUDA and compiled on a GPU machine (kernelkit decides which).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import gptoss.kernels.linear as lin
from gptoss.kernels.linear import GEMV_MAX_T, gemv, linear
from tests.gptoss.kernels.kernelkit import DEV, INTERPRETER_WARNINGS

pytestmark = INTERPRETER_WARNINGS


def operands(t: int, n: int, k: int, dtype: torch.dtype, bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, k, generator=g).to(DEV, dtype)  # [T, K]
    w = (torch.randn(n, k, generator=g) / k**0.5).to(DEV, dtype)  # [N, K]
    b = torch.randn(n, generator=g).to(DEV, dtype) if bias else None  # [N]
    return x, w, b


def reference(x, w, b):
    """F.linear on the same values in float32, before any rounding to the storage dtype."""
    return F.linear(x.float(), w.float(), None if b is None else b.float())


@pytest.mark.parametrize("t", [1, 2, 3, 8])
@pytest.mark.parametrize(("n", "k"), [(77, 96), (64, 40), (130, 300)])
@pytest.mark.parametrize("bias", [True, False])
def test_bf16_matches_float32_reference(t, n, k, bias):
    x, w, b = operands(t, n, k, torch.bfloat16, bias, seed=t * 1000 + n + k)
    y = gemv(x, w, b)
    want = reference(x, w, b)  # [T, N] float32
    assert y.dtype == torch.bfloat16 and y.shape == (t, n)
    # One rounding of a float32 sum to bf16: within half a bf16 ulp (2^-8 relative), plus the
    # float32 sum's own order error (~K * 2^-24 of sum |x w|, far below 1e-4 at these sizes).
    err = (y.float() - want).abs()
    assert bool((err <= want.abs() * 2**-8 + 1e-4).all()), float(err.max())
    # Products of bf16 values are exact in float32, so rounding the reference itself mostly agrees.
    assert (y == want.bfloat16()).float().mean().item() >= 0.99


@pytest.mark.parametrize("t", [1, 3, 8])
def test_float32_matches_f_linear(t):
    x, w, b = operands(t, 77, 96, torch.float32, True, seed=t)
    torch.testing.assert_close(gemv(x, w, b), reference(x, w, b), rtol=1e-5, atol=1e-5)


def test_rows_do_not_depend_on_the_batch():
    x, w, b = operands(8, 77, 96, torch.bfloat16, True, seed=7)
    together = gemv(x, w, b)  # [8, N]
    for i in (0, 5):
        assert torch.equal(gemv(x[i : i + 1], w, b), together[i : i + 1])


def test_strided_x_rows():
    x, w, b = operands(3, 33, 64, torch.bfloat16, True, seed=3)
    wide = torch.zeros(3, 80, dtype=x.dtype, device=DEV)
    wide[:, :64] = x
    assert torch.equal(gemv(wide[:, :64], w, b), gemv(x, w, b))


def test_large_t_falls_back_to_f_linear_exactly():
    x, w, b = operands(GEMV_MAX_T + 1, 77, 96, torch.bfloat16, True, seed=9)
    assert torch.equal(linear(x, w, b), F.linear(x, w, b))
    x3 = x.view(1, GEMV_MAX_T + 1, 96)  # not [T, K]: F.linear too
    assert torch.equal(linear(x3, w, b), F.linear(x3, w, b))


def test_linear_takes_the_kernel_on_cuda_up_to_max_t(monkeypatch):
    calls = []

    def spy(*args):
        calls.append(args[0].shape[0])
        return gemv(*args)

    monkeypatch.setattr(lin, "gemv", spy)
    monkeypatch.setattr(lin, "GEMV", "dot")  # the default (preload) takes T 1-2 itself
    for t in (1, GEMV_MAX_T, GEMV_MAX_T + 1):
        x, w, b = operands(t, 77, 96, torch.bfloat16, True, seed=t)
        y = linear(x, w, b)
        assert torch.equal(y, gemv(x, w, b) if calls and calls[-1] == t else F.linear(x, w, b))
    assert calls == ([1, GEMV_MAX_T] if DEV == "cuda" else [])
    # a tall W (N >= K, as QKV [5120, 2880]) stays on cuBLAS, which does not split its K
    x, w, b = operands(1, 96, 77, torch.bfloat16, True, seed=9)
    assert torch.equal(linear(x, w, b), F.linear(x, w, b))
    assert calls == ([1, GEMV_MAX_T] if DEV == "cuda" else [])


def test_gemv_beyond_max_t_and_rejects_bad_operands():
    x, w, b = operands(16, 40, 64, torch.bfloat16, False, seed=4)
    want = reference(x, w, b)
    assert bool(((gemv(x, w, b).float() - want).abs() <= want.abs() * 2**-8 + 1e-4).all())
    with pytest.raises(ValueError, match="share a dtype"):
        gemv(x, w.float())
    with pytest.raises(ValueError, match="need x"):
        gemv(x, w[:, :32])
    with pytest.raises(ValueError, match="contiguous"):
        gemv(x, w, torch.zeros(80, dtype=x.dtype, device=DEV)[::2])


def test_stages_that_fit_keep_the_buffers_in_shared_memory():
    h100 = 232_448  # the max_shared_mem Triton reads for an H100 or H200
    # float32 at TB 64 (the batch-invariant mode's token block): 5 buffers of 48 KB did not launch
    assert lin.stages_that_fit(6, (32 + 64) * 128 * 4, h100) == 5
    assert lin.stages_that_fit(6, (32 + 64) * 128 * 2, h100) == 6  # bf16: unchanged
    assert lin.stages_that_fit(6, (32 + 16) * 128 * 4, h100) == 6  # float32 decode block: unchanged
    assert lin.stages_that_fit(3, 100_000, 150_000) == 2
    assert lin.stages_that_fit(6, 300_000, h100) == 1  # one stage: no pipeline buffers


@pytest.mark.skipif(DEV != "cuda", reason="shared memory limits are a GPU's")
def test_float32_at_a_64_token_block_launches_and_matches_f_linear():
    # v72 (H100): this token block at 6 stages asked for 245,760 bytes of shared memory and raised
    x, w, b = operands(70, 64, 4096, torch.float32, True, seed=11)
    torch.testing.assert_close(gemv(x, w, b, token_block=64), reference(x, w, b), rtol=1e-4, atol=1e-4)

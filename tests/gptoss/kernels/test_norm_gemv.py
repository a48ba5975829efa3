"""The add + RMSNorm inside the QKV GEMV (gemv_preload.norm_gemv_preload, GPTOSS_NORM_QKV) against
the two launches it replaces, fused_add_rms_norm then gemv_preload.

Runs in Triton's interpreter on CPU (TRITON_INTERPRET=1, the default here); on a GPU machine
`TRITON_INTERPRET=0 pytest tests/gptoss/kernels/test_norm_gemv.py` runs the same tests compiled.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

import pytest
import torch

from gptoss.kernels.gemv_preload import MAX_T, gemv_preload, norm_gemv_preload
from gptoss.kernels.rmsnorm import fused_add_rms_norm
from tests.gptoss.kernels.test_linear import DEV

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")


def norm_operands(t: int, k: int, top_k: int, residual: bool, dtype: torch.dtype, seed: int):
    """The norm's inputs: x [T*k, H] (the MoE's rows) with combine weights, or x [T, H]."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t * max(top_k, 1), k, generator=g).to(DEV, dtype)
    res = torch.randn(t, k, generator=g).to(DEV, dtype) if residual else None
    cw = torch.rand(t, top_k, generator=g).to(DEV) if top_k else None
    nw = (torch.rand(k, generator=g) + 0.5).to(DEV)  # float32, as the engine keeps norm weights
    return x, res, cw, nw


def gemv_operands(n: int, k: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, k, generator=g) / k**0.5).to(DEV, dtype), torch.randn(n, generator=g).to(
        DEV, dtype
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(
    ("t", "k", "n", "top_k", "residual"),
    [
        (1, 300, 33, 4, True),  # a decode layer: the MoE's 4 rows combined, K in two parts (256 + 64)
        (2, 96, 20, 0, True),  # two tokens, no combine
        (1, 64, 16, 0, False),  # layer 0: no residual yet (r is x itself), K in one part
        (2, 300, 9, 2, True),
    ],
)
def test_equals_the_norm_then_the_gemv(dtype, t, k, n, top_k, residual):
    x, res, cw, nw = norm_operands(t, k, top_k, residual, dtype, seed=t * 7 + k + n)
    w, b = gemv_operands(n, k, dtype, seed=n)
    h, r_want = fused_add_rms_norm(x, res, nw, 1e-5, combine=cw)
    want = gemv_preload(h, w, b)
    y, r = norm_gemv_preload(x, res, nw, 1e-5, w, b, combine=cw, block_n=4, num_warps=2)
    assert y.shape == (t, n) and y.dtype == dtype and r.shape == (t, k)
    assert torch.equal(r, r_want)  # the same residual sum and rounding, stored by program 0 alone
    if not residual:
        assert r is x
    if DEV == "cpu":  # numpy's sums: the two trees of squares add up as the one does
        assert torch.equal(y, want)
    else:  # compiled, the sum of squares' order may move rstd by an ulp: h by a bf16 place at most
        assert (y == want).float().mean().item() >= 0.95
        torch.testing.assert_close(y.float(), want.float(), rtol=2**-6, atol=1e-2)


def test_tiles_do_not_change_the_result():
    x, res, cw, nw = norm_operands(1, 300, 4, True, torch.bfloat16, seed=3)
    w, b = gemv_operands(50, 300, torch.bfloat16, seed=4)
    y, r = norm_gemv_preload(x, res, nw, 1e-5, w, b, combine=cw, block_n=16, num_warps=4)
    y2, r2 = norm_gemv_preload(x, res, nw, 1e-5, w, b, combine=cw, block_n=2, num_warps=1)
    assert torch.equal(y, y2) and torch.equal(r, r2)


def test_rejects_what_it_does_not_take():
    x, res, cw, nw = norm_operands(MAX_T + 1, 64, 0, True, torch.bfloat16, seed=1)
    w, b = gemv_operands(16, 64, torch.bfloat16, seed=1)
    with pytest.raises(ValueError, match=rf"1 <= T <= {MAX_T} rows.*\(T {MAX_T + 1}\)"):
        norm_gemv_preload(x, res, nw, 1e-5, w, b)
    with pytest.raises(ValueError, match=r"w \[N, H\] of x's dtype, got x \(1, 64\).*w \(16, 48\)"):
        norm_gemv_preload(x[:1], res[:1], nw, 1e-5, w[:, :48].contiguous(), b)
    with pytest.raises(ValueError, match=r"b must be \[16\], got \(15,\)"):
        norm_gemv_preload(x[:1], res[:1], nw, 1e-5, w, b[:15])
    with pytest.raises(ValueError, match="need a residual"):  # the norm's own checks
        norm_gemv_preload(x[:1], None, nw, 1e-5, w, b, combine=torch.ones(1, 1, device=DEV))

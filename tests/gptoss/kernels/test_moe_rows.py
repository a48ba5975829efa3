"""gptoss.kernels.moe.moe_rows: the MoE without its combine, which the engine's next add + RMSNorm does
(kernel_model.COMBINE_IN_NORM): combined there, the same bits as moe_forward's own combine. Without
CUDA the kernels run in Triton's interpreter."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated by triton.jit
pytest.importorskip("triton")

from gptoss.kernels import moe, rmsnorm  # noqa: E402
from gptoss.kernels.moe_routing import SINGLE_PROGRAM_MAX_TOKENS  # noqa: E402
from tests.gptoss.kernels.moekit import (  # noqa: E402, F401 - fixtures used by name
    ALPHA,
    DEV,
    LIMIT,
    interpreter_like_the_gpu,
    make_moe,
    poisoned_buffers,
    pytestmark,
)


@pytest.mark.parametrize("t, large", [(SINGLE_PROGRAM_MAX_TOKENS + 6, None), (24, "v3")])
def test_moe_rows_combined_by_the_next_norm_are_moe_forwards_bits(t, large):
    """Several routing programs on v2 weights, and one on the large v3 copy."""
    ref, w = make_moe(8, 64, 64, 4, torch.bfloat16, seed=4, large=large)
    x = (torch.randn(t, 64, device=DEV) * 3).bfloat16()
    residual = torch.randn(t, 64, device=DEV).bfloat16()
    norm_w = (1 + 0.1 * torch.randn(64, device=DEV)).bfloat16()
    a = (x, ref.router_weight, ref.router_bias, 4, w, ALPHA, LIMIT)
    y, weights = moe.moe_rows(*a)
    assert y.shape == (t * 4, 64) and weights.shape == (t, 4)
    got = rmsnorm.fused_add_rms_norm(y, residual.clone(), norm_w, 1e-5, combine=weights)
    want = rmsnorm.fused_add_rms_norm(moe.moe_forward(*a), residual.clone(), norm_w, 1e-5)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_decode_sizes_come_back_combined():
    ref, w = make_moe(8, 64, 64, 4, torch.bfloat16, seed=5)
    x = (torch.randn(3, 64, device=DEV) * 3).bfloat16()
    a = (x, ref.router_weight, ref.router_bias, 4, w, ALPHA, LIMIT)
    out, weights = moe.moe_rows(*a)
    assert weights is None and torch.equal(out, moe.moe_forward(*a))


def test_no_tokens_and_mismatched_shapes():
    ref, w = make_moe(8, 64, 64, 4, torch.bfloat16, seed=6)
    out, weights = moe.moe_rows(
        torch.empty(0, 64, device=DEV).bfloat16(), ref.router_weight, ref.router_bias, 4, w, ALPHA, LIMIT
    )
    assert out.shape == (0, 64) and weights is None
    with pytest.raises(
        ValueError, match=r"moe_forward: x \(5, 32\), router \(8, 64\) do not match the experts"
    ):
        moe.moe_rows(
            torch.zeros(5, 32, device=DEV).bfloat16(), ref.router_weight, ref.router_bias, 4, w, ALPHA, LIMIT
        )

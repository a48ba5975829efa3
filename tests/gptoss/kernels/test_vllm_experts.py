"""gptoss.vllm_experts: the vLLM plugin's experts, from vLLM's parameter layout, on both paths.

torch (CPU) must be the reference MoE exactly: the same code on views of the same bytes. triton
(CUDA; here Triton's interpreter) is held to test_moe_kernel's tolerances against the reference.
The router's logits come from outside, as vLLM computes them before its MoE layer.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gptoss.vllm_experts import GptossExperts
from tests.gptoss.kernels.moekit import (  # interpreter_like_the_gpu: autouse, fixes the interpreter
    ALPHA,
    DEV,
    LIMIT,
    TOL,
    interpreter_like_the_gpu,  # noqa: F401
    make_moe,
    reference,
)

pytestmark = [
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning"),
]


def vllm_layout(ref) -> tuple[torch.Tensor, ...]:
    """The tensors vLLM's gpt-oss loader fills: blocks with their last two dims merged."""
    ex = ref.experts
    e, n2, g, _ = ex.gate_up_blocks.shape
    h = ex.down_blocks.shape[1]
    return (
        ex.gate_up_blocks.reshape(e, n2, g * 16).clone(),
        ex.gate_up_scales.clone(),
        ex.gate_up_bias.float(),
        ex.down_blocks.reshape(e, h, -1).clone(),
        ex.down_scales.clone(),
        ex.down_bias.float(),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("path", "kernels"), [("torch", None), ("triton", None), ("triton", "v3")])
def test_experts_from_vllms_layout_match_the_reference(path, kernels, dtype):
    """kernels v3: the layout moe_layout.layouts gives 120b (no room for a second copy)."""
    ref, _ = make_moe(8, 64, 96, 4, dtype, seed=5)
    kw = {"top_k": 4, "alpha": ALPHA, "limit": LIMIT, "dtype": dtype, "path": path, "kernels": kernels}
    experts = GptossExperts(*vllm_layout(ref), **kw)
    x = (torch.randn(13, 64, device=DEV) * 3).to(dtype)
    logits = F.linear(x, ref.router_weight, ref.router_bias)  # [T, E]
    got = experts(x, logits)
    assert got.shape == x.shape and got.dtype == dtype
    if path == "torch":
        assert experts.kernels == "torch"
        assert torch.equal(got, ref(x))
        return
    assert experts.kernels == (kernels or "v2") and experts._weights.layout == ("v3" if kernels else "bits")
    want = reference(ref, x)
    err = ((got.double() - want.double()).norm() / want.double().norm()).item()
    assert err <= TOL[dtype], f"rel error {err:.2e} > {TOL[dtype]:.0e}"


@pytest.mark.parametrize("kernels", [None, "v3"])
def test_scales_beyond_the_v2_kernels_range_take_v1(kernels):
    ref, _ = make_moe(4, 64, 64, 2, torch.float32, seed=6)
    w13, s13, b13, w2, s2, b2 = vllm_layout(ref)
    s2[0, 0, 0] = 129  # > MAX_SCALE_V2: 2^(s - 1) overflows bf16
    kw = {"top_k": 2, "alpha": ALPHA, "limit": LIMIT, "dtype": torch.float32}
    experts = GptossExperts(w13, s13, b13, w2, s2, b2, path="triton", kernels=kernels, **kw)
    assert experts.kernels == "v1"


def test_mismatched_shapes_and_unknown_paths_are_refused():
    ref, _ = make_moe(4, 64, 64, 2, torch.float32, seed=7)
    w13, s13, b13, w2, s2, b2 = vllm_layout(ref)
    kw = {"top_k": 2, "alpha": ALPHA, "limit": LIMIT, "dtype": torch.float32}
    with pytest.raises(ValueError, match="path must be one of triton, torch"):
        GptossExperts(w13, s13, b13, w2, s2, b2, path="cuda", **kw)
    with pytest.raises(ValueError, match="do not match"):
        GptossExperts(w13, s13, b13, w2[:, :32], s2[:, :32], b2, path="torch", **kw)

"""The v3 MoE GEMMs (gptoss.kernels.moe_v3, weights prepared with kernels="v3") against the reference
gptoss.model.MoE and the v2 kernels.

Triton 3.6's interpreter has no tl.dot_scaled (its builder lacks create_dot_scaled), so on CPU the
kernels run their SCALED=False stand-in: the same weight bytes and scales, dequantized by v1's
portable path, then tl.dot; every index, mask, K tail and epilogue is the compiled kernel's. The
dot_scaled call itself (operand order, nibble order, scale semantics) is checked on CUDA only.
Tolerances as tests/gptoss/kernels/test_moe_kernel.py's bf16 (1e-2 relative over the whole output:
the reference rounds x @ W13 to bf16 and runs SwiGLU in bf16, the kernels keep float32 until act);
v3 against v2 (the same float32 accumulation, dequantized weights exact in both) 1e-2 as well:
the summation order differs and act is rounded to bf16 between the GEMMs.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated by triton.jit
pytest.importorskip("triton")

from gptoss.kernels import moe  # noqa: E402
from gptoss.kernels.moe import Tiles, moe_forward, prepare_moe_weights  # noqa: E402
from gptoss.kernels.moe_routing import route_and_group  # noqa: E402
from gptoss.kernels.moe_tiles import TILE_OVERRIDE, choose_tiles_v3  # noqa: E402
from tests.gptoss.kernels.test_moe_kernel import (  # noqa: E402, F401 - the fixtures apply here too
    ALPHA,
    DEV,
    LIMIT,
    check_against_reference,
    gpu,
    interpreter_like_the_gpu,
    make_moe,
    poisoned_buffers,
    pytestmark,
    reference,
)

TOL = 1e-2


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    assert not got.isnan().any()
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def test_prepare_v3_keeps_the_checkpoint_nibbles_in_gate_and_up_planes():
    ref, w = make_moe(4, 64, 96, 2, torch.bfloat16, seed=11, kernels="v3")
    _, w1 = make_moe(4, 64, 96, 2, torch.bfloat16, seed=11, kernels="v1")
    assert w.layout == "v3" and w.shape == (4, 64, 96)
    assert w.w13.shape == (4, 2, 96, 32) and w.s13.shape == (4, 2, 96, 16) and w.w2.shape == (4, 64, 48)
    for a, b in zip((w.w13, w.s13, w.b13, w.w2, w.s2, w.b2), (w1.w13, w1.s13, w1.b13, w1.w2, w1.s2, w1.b2)):
        assert torch.equal(a, b)


def test_prepare_rejects_unknown_kernels():
    with pytest.raises(ValueError, match="kernels must be 'v1' or 'v2' or 'v3', got 'v4'"):
        make_moe(4, 64, 64, 2, torch.bfloat16, seed=0, kernels="v4")


@pytest.mark.parametrize("tokens", [1, 5, 64, 130])
def test_v3_forward_matches_reference(tokens):
    ref, w = make_moe(8, 64, 64, 4, torch.bfloat16, seed=tokens, kernels="v3")
    check_against_reference(ref, w, (torch.randn(tokens, 64, device=DEV) * 3).bfloat16())


def test_v3_matches_v2_on_the_same_checkpoint():
    ref, w3 = make_moe(8, 96, 64, 4, torch.bfloat16, seed=21, kernels="v3")
    _, w2 = make_moe(8, 96, 64, 4, torch.bfloat16, seed=21, kernels="v2")
    x = (torch.randn(20, 96, device=DEV) * 3).bfloat16()
    got = moe_forward(x, ref.router_weight, ref.router_bias, 4, w3, ALPHA, LIMIT)
    want = moe_forward(x, ref.router_weight, ref.router_bias, 4, w2, ALPHA, LIMIT)
    assert _rel(got, want) <= TOL


def test_v3_an_expert_with_every_token_and_one_with_none():
    ref, w = make_moe(8, 64, 64, 4, torch.bfloat16, seed=4, kernels="v3")
    ref.router_bias[0] = 50.0  # expert 0 wins every token
    ref.router_bias[5] = -50.0  # expert 5 never makes the top 4
    x = (torch.randn(40, 64, device=DEV) * 3).bfloat16()
    r = route_and_group(F.linear(x, ref.router_weight, ref.router_bias), 4)
    assert r.counts[0].item() == 40 and r.counts[5].item() == 0
    check_against_reference(ref, w, x)


@pytest.mark.parametrize(
    "tiles",
    [
        Tiles(16, 64, 128, 4, 3),  # K 160 = 128 + a 32 tail; N 96 = 64 + a partial tile
        Tiles(32, 64, 64, 4, 2),  # K 160: two whole steps and a half one
        Tiles(64, 128, 128, 8, 3),  # one partial N tile
        Tiles(16, 64, 32, 4, 2),  # BK 32: one scale a step, no tail
    ],
)
def test_every_v3_tile_shape_with_k_and_n_tails(tiles):
    """H = 160 (gate_up's K), I = 96 (down's K, and N of gate_up): K % BK != 0 for BK 64 and 128."""
    ref, w = make_moe(8, 160, 96, 4, torch.bfloat16, seed=7, kernels="v3")
    x = (torch.randn(12, 160, device=DEV) * 3).bfloat16()
    r = route_and_group(F.linear(x, ref.router_weight, ref.router_bias), 4)
    y = moe.down_v3(moe.gate_up_v3(x, r, w, ALPHA, LIMIT, tiles), r, w, tiles)  # [T*k, H]
    assert y.shape == (48, 160)
    assert _rel(moe.combine(y, r.weights, x.dtype), reference(ref, x)) <= TOL


def test_v3_gate_up_rows_are_in_assignment_order():
    """act row a = t*k + j is token t's j-th expert, as v2 writes it (combine relies on it)."""
    ref, w3 = make_moe(8, 64, 64, 4, torch.bfloat16, seed=8, kernels="v3")
    _, w2 = make_moe(8, 64, 64, 4, torch.bfloat16, seed=8, kernels="v2")
    x = (torch.randn(9, 64, device=DEV) * 3).bfloat16()
    r = route_and_group(F.linear(x, ref.router_weight, ref.router_bias), 4)
    a3 = moe.gate_up_v3(x, r, w3, ALPHA, LIMIT, choose_tiles_v3(9, 4, 8, 64, 64, gate_up=True))
    a2 = moe.gate_up_v2(x, r, w2, ALPHA, LIMIT, moe.choose_tiles_v2(9, 4, 8, 64, 64, gate_up=True))
    assert a3.shape == (36, 64)
    for row in range(36):  # row by row: a swap of two rows would pass a whole-tensor norm
        assert _rel(a3[row], a2[row]) <= 2e-2, row


def test_v3_rejects_float32_activations():
    ref, w = make_moe(4, 64, 64, 2, torch.float32, seed=0, kernels="v3")
    x = torch.randn(3, 64, device=DEV)
    with pytest.raises(ValueError, match="v3 MoE kernels take bfloat16 or float16 activations"):
        moe_forward(x, ref.router_weight, ref.router_bias, 2, w, ALPHA, LIMIT)


def test_choose_tiles_v3_buckets_and_override():
    assert choose_tiles_v3(4096, 4, 32, 2880, 2880, gate_up=True) == Tiles(128, 128, 128, 8, 3)
    assert choose_tiles_v3(4096, 4, 32, 2880, 2880, gate_up=False) == Tiles(128, 256, 128, 8, 3)
    assert choose_tiles_v3(256, 4, 32, 2880, 2880, gate_up=True).bm == 32
    assert choose_tiles_v3(1, 4, 8, 64, 64, gate_up=True) == Tiles(16, 64, 64, 4, 4)  # BK <= K's power of 2
    TILE_OVERRIDE[(128, True)] = Tiles(64, 256, 128, 8, 4)
    try:
        assert choose_tiles_v3(4096, 4, 32, 2880, 2880, gate_up=True) == Tiles(64, 256, 128, 8, 4)
    finally:
        TILE_OVERRIDE.clear()


@gpu
@pytest.mark.parametrize("tokens", [1, 64, 256, 1024, 4096])
def test_v3_20b_shape_on_gpu_matches_v2(tokens):
    """The compiled dot_scaled path at the real shapes (H = I = 2880: K tails for BK 128)."""
    ref, w3 = make_moe(32, 2880, 2880, 4, torch.bfloat16, seed=tokens, kernels="v3")
    _, w2 = make_moe(32, 2880, 2880, 4, torch.bfloat16, seed=tokens, kernels="v2")
    x = torch.randn(tokens, 2880, device=DEV).bfloat16()
    got = moe_forward(x, ref.router_weight, ref.router_bias, 4, w3, ALPHA, LIMIT)
    want = moe_forward(x, ref.router_weight, ref.router_bias, 4, w2, ALPHA, LIMIT)
    assert _rel(got, want) <= TOL
    if tokens <= 64:
        check_against_reference(ref, w3, x)

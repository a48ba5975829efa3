"""The LoRA MoE kernels (gptoss.kernels.moe_lora) against the reference MoE with a LoraStep.

Two adapters of different ranks (4 and 8: the stack pads both to 8 columns, W = 16) adapt the
experts of one layer; a batch mixes tokens of both and of the base model (index 0). Without CUDA
the kernels run in Triton's interpreter at small shapes (E 8, H = I = 64, top-4). Tolerances are
test_moe_kernel's: float32 1e-5 (only the summation order differs), bfloat16 1e-2.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated by triton.jit
pytest.importorskip("triton")

from gptoss.config import PRESETS  # noqa: E402
from gptoss.kernels import moe_common, moe_decode, moe_lora  # noqa: E402
from gptoss.kernels.moe import moe_forward  # noqa: E402
from gptoss.kernels.moe_lora import moe_forward_lora, prepare_moe_lora, shrink, shrink_dense  # noqa: E402
from gptoss.kernels.moe_routing import route_and_group  # noqa: E402
from gptoss.lora import LoraAdapter, LoraTarget  # noqa: E402
from gptoss.lora_stack import LoraStack  # noqa: E402
from tests.gptoss.kernels.moekit import (  # noqa: E402, F401 (the autouse fixture applies here too)
    ALPHA,
    DEV,
    LIMIT,
    TOL,
    interpreter_like_the_gpu,
    make_moe,
)

MC = PRESETS["tiny"].with_layers(1)  # E 8, H = I = 64, top-4
pytestmark = [
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning"),
]


@pytest.fixture(autouse=True)
def poisoned_buffers(monkeypatch):
    """Every act / y / out / shrink buffer starts as NaN, so a row no kernel writes fails the test."""

    def nan(shape, dtype, device):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    monkeypatch.setattr(moe_common, "_empty", nan)
    monkeypatch.setattr(moe_lora, "_empty", nan)


def adapter(name: str, rank: int, seed: int, targets=("gate_up_proj", "down_proj")) -> LoraAdapter:
    g = torch.Generator().manual_seed(seed)
    e, h, i = MC.num_local_experts, MC.hidden_size, MC.intermediate_size
    dims = {"gate_up_proj": (h, 2 * i), "down_proj": (i, h)}
    out = {}
    for t in targets:
        fan_in, fan_out = dims[t]
        a = torch.randn(e, rank, fan_in, generator=g) / fan_in**0.5
        b = torch.randn(e, fan_out, rank, generator=g) * 0.3 / rank**0.5
        out[0, t] = LoraTarget(a, b, scale=2.0)
    return LoraAdapter(name, Path(name), out)


def stack_of(adapters, dtype):
    return LoraStack(adapters, MC, torch.device(DEV), dtype)


def check(ref, w, stack, x, index):
    lora = prepare_moe_lora(stack.layers[0].experts, stack.rank)
    got = moe_forward_lora(x, ref.router_weight, ref.router_bias, ref.top_k, w, lora, index, ALPHA, LIMIT)
    want = ref(x, stack.step(0, stack.mask(index)))
    assert got.shape == want.shape and got.dtype == x.dtype and not got.isnan().any()
    err = ((got.double() - want.double()).norm() / want.double().norm()).item()
    assert err <= TOL[x.dtype], f"rel error {err:.2e} > {TOL[x.dtype]:.0e}"
    return got


@pytest.mark.parametrize("kernels", ["v1", "v2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mixed_adapters_match_the_reference(dtype, kernels):
    ref, w = make_moe(8, 64, 64, 4, dtype, seed=11, kernels=kernels)
    stack = stack_of([adapter("a", 4, 1), adapter("b", 8, 2)], dtype)
    assert (stack.rank, stack.width) == (8, 16)
    x = (torch.randn(17, 64, generator=torch.Generator().manual_seed(3)) * 3).to(DEV, dtype)
    index = torch.tensor([0, 1, 2] * 5 + [2, 1], device=DEV)
    got = check(ref, w, stack, x, index)
    # The adapters change their tokens, and only theirs: base tokens equal the plain kernels' output.
    base = moe_forward(x, ref.router_weight, ref.router_bias, ref.top_k, w, ALPHA, LIMIT)
    mine = index == 0
    assert torch.equal(got[mine], base[mine])
    delta = (got[~mine].float() - base[~mine].float()).norm() / base[~mine].float().norm()
    assert delta > 0.05


def test_gate_up_only_adapter_and_many_tokens():
    """T = 100 routes with several programs and fills BM = 64 tiles; only gate_up is adapted."""
    ref, w = make_moe(8, 64, 64, 4, torch.float32, seed=12)
    stack = stack_of([adapter("a", 16, 4, targets=("gate_up_proj",))], torch.float32)
    lora = prepare_moe_lora(stack.layers[0].experts, stack.rank)
    assert lora.a2 is None and lora.b13.shape == (8, 2, 64, 16)
    x = torch.randn(100, 64, generator=torch.Generator().manual_seed(5)).to(DEV) * 3
    index = torch.randint(0, 2, (100,), generator=torch.Generator().manual_seed(6)).to(DEV)
    check(ref, w, stack, x, index)


def test_shrink_masks_each_row_to_its_tokens_adapter():
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(7)).to(DEV)
    stack = stack_of([adapter("a", 4, 1), adapter("b", 8, 2)], torch.float32)
    a13 = stack.layers[0].experts["gate_up_proj"][0]  # [E, W, H]
    logits = torch.randn(5, 8, generator=torch.Generator().manual_seed(8)).to(DEV)
    r = route_and_group(logits, 4)
    index = torch.tensor([2, 0, 1, 1, 2], device=DEV)
    s = shrink(x, a13, r, index, stack.rank, token_div=4)  # [20, 16]
    for t in range(5):
        for j in range(4):
            e = int(r.ids[t, j])
            want = (x[t] @ a13[e].T) * stack.table[index[t]]
            torch.testing.assert_close(s[t * 4 + j], want, rtol=1e-5, atol=1e-6)
    assert s[4:8].abs().max() == 0  # token 1 runs the base model
    assert s[8:16, 8:].abs().max() == 0 and s[0:4, :8].abs().max() == 0  # other adapters' columns


@pytest.mark.parametrize("shrink_mode", ["dense", "grouped"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t", [1, 5, 16])
def test_decode_sizes_take_the_decode_kernels_with_the_expand(monkeypatch, dtype, t, shrink_mode):
    """T <= moe_decode.MAX_T on the bits layout: the decode GEMMs add the LoRA expand in their epilogue
    (both of them called with a LoRA pair), and the tokens match the reference with the adapters,
    with either decode shrink (GPTOSS_LORA_SHRINK)."""
    monkeypatch.setattr(moe_lora, "LORA_SHRINK", shrink_mode)
    used = []
    for name in ("shrink", "shrink_dense"):
        real = getattr(moe_lora, name)
        monkeypatch.setattr(
            moe_lora, name, lambda *a, _r=real, _n=name, **kw: used.append(_n) or _r(*a, **kw)
        )
    calls = []
    for name in ("gate_up_dec", "down_dec"):
        real = getattr(moe_decode, name)

        def spy(*a, _real=real, _name=name, **kw):
            calls.append((_name, kw.get("lora") is not None))
            return _real(*a, **kw)

        monkeypatch.setattr(moe_decode, name, spy)
    ref, w = make_moe(8, 64, 64, 4, dtype, seed=21, kernels="v2")
    assert moe_decode.use_decode(torch.empty(t, 64, device=DEV), w)
    stack = stack_of([adapter("a", 4, 1), adapter("b", 8, 2)], dtype)
    x = (torch.randn(t, 64, generator=torch.Generator().manual_seed(30 + t)) * 3).to(DEV, dtype)
    index = torch.tensor(([1, 0, 2] * 6)[:t], device=DEV)
    got = check(ref, w, stack, x, index)
    assert calls == [("gate_up_dec", True), ("down_dec", True)]
    assert used == ["shrink_dense" if shrink_mode == "dense" else "shrink"] * 2
    base = moe_forward(x, ref.router_weight, ref.router_bias, ref.top_k, w, ALPHA, LIMIT)
    mine = index == 0
    assert torch.equal(got[mine], base[mine])  # the base model's tokens get no delta
    assert ((got[~mine].float() - base[~mine].float()).norm() / base[~mine].float().norm()) > 0.05


def test_decode_with_a_down_only_adapter():
    ref, w = make_moe(8, 64, 64, 4, torch.float32, seed=22, kernels="v2")
    stack = stack_of([adapter("a", 8, 3, targets=("down_proj",))], torch.float32)
    lora = prepare_moe_lora(stack.layers[0].experts, stack.rank)
    assert lora.a13 is None and lora.a2 is not None
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(9)).to(DEV) * 3
    check(ref, w, stack, x, torch.tensor([1, 1, 0], device=DEV))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dense_shrink_equals_the_grouped_shrink_and_reads_packed_rows(dtype):
    """shrink_dense (decode sizes) gives what the grouped shrink gives, by assignment, and with
    packed=True reads rows stored expert by expert (moe_decode's act); base-model rows are zero."""
    stack = stack_of([adapter("a", 4, 1), adapter("b", 8, 2)], dtype)
    a2 = stack.layers[0].experts["down_proj"][0]  # [E, W, I]
    logits = torch.randn(6, 8, generator=torch.Generator().manual_seed(10)).to(DEV)
    r = route_and_group(logits, 4)
    by_assignment = torch.randn(24, 64, generator=torch.Generator().manual_seed(11)).to(DEV, dtype)
    order = [int(r.rows[e, s]) for e in range(8) for s in range(int(r.counts[e]))]  # packed -> assignment
    assert sorted(order) == list(range(24))
    packed = by_assignment[order]
    index = torch.tensor([2, 0, 1, 1, 2, 1], device=DEV)
    want = shrink(by_assignment, a2, r, index, stack.rank, token_div=1)
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    for got in (
        shrink(packed, a2, r, index, stack.rank, token_div=1, packed=True),
        shrink_dense(by_assignment, a2, r, index, stack.rank, token_div=1),
        shrink_dense(packed, a2, r, index, stack.rank, token_div=1, packed=True),
    ):
        assert not got.isnan().any()
        torch.testing.assert_close(got, want, **tol)
    assert want.abs().max() > 0 and want[4:8].abs().max() == 0  # token 1 runs the base model


def test_decode_gate_up_refuses_a_shrink_without_the_routing():
    """With logits the gate_up kernel routes itself, after a LoRA shrink would have needed the routing."""
    _, w = make_moe(8, 64, 64, 4, torch.float32, seed=23, kernels="v2")
    x = torch.zeros(2, 64, device=DEV)
    r = route_and_group(torch.zeros(2, 8, device=DEV), 4)
    lora = (torch.zeros(8, 2, 64, 16, device=DEV), torch.zeros(8, 16, device=DEV))
    tiles = moe_decode.dec_tiles(True, 64)
    with pytest.raises(ValueError, match="a LoRA shrink needs the routing first"):
        moe_decode.gate_up_dec(x, r, w, ALPHA, LIMIT, tiles, logits=torch.zeros(2, 8, device=DEV), lora=lora)

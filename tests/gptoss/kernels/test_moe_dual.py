"""Two copies of the experts (prepare_moe_weights(large="v3")): v2 for the decode kernels and below
LARGE_MIN_ROWS rows an expert; moe_forward and moe_forward_lora pick the copy by the batch (spied
on: which kernels ran, on which layout) and both copies match the reference gptoss.model.MoE.
Tolerances as test_moe_kernel.py's (bf16 1e-2 relative over the whole output)."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated by triton.jit
pytest.importorskip("triton")

from gptoss.kernels import moe, moe_decode, moe_layout, moe_lora, moe_v3_dec, moe_v3_dec_gu  # noqa: E402
from gptoss.kernels.moe import MoEWeights, prepare_moe_weights  # noqa: E402
from gptoss.kernels.moe_layout import for_rows  # noqa: E402
from tests.gptoss.kernels.moekit import (  # noqa: E402, F401 - the fixtures apply here too
    DEV,
    check_against_reference,
    interpreter_like_the_gpu,
    make_moe,
    poisoned_buffers,
    pytestmark,
)

E, H, TOP_K = 8, 64, 4  # test_moe_lora_kernel's tiny preset: rows an expert = cdiv(4 T, 8)
MIN_ROWS = 8  # LARGE_MIN_ROWS here: T <= 14 runs v2, T >= 15 v3


@pytest.fixture
def ran(monkeypatch) -> list[tuple[str, str]]:
    """(kernel family, weight layout) of every gate_up / down call moe and moe_lora make."""
    calls: list[tuple[str, str]] = []
    monkeypatch.setattr(moe_layout, "LARGE_MIN_ROWS", MIN_ROWS)
    monkeypatch.setattr(moe_decode, "MAX_T", 0)  # small T takes the M-tile kernels here, not the decode path
    for mod in (moe_v3_dec, moe_v3_dec_gu):  # nor the v3 copy's split-K decode kernels (9-16 tokens too)
        monkeypatch.setattr(mod, "TOKENS", frozenset())
    for mod in (moe, moe_lora, moe_decode):
        for name in ("gate_up_v2", "down_v2", "gate_up_v3", "down_v3", "gate_up_dec"):
            if not hasattr(mod, name):
                continue
            real = getattr(mod, name)

            def spy(x, r, w, *rest, _real=real, _name=name, **kw):
                calls.append((_name, w.layout))
                return _real(x, r, w, *rest, **kw)

            monkeypatch.setattr(mod, name, spy)
    return calls


V2 = [("gate_up_v2", "bits"), ("down_v2", "bits")]
DEC = [("gate_up_dec", "bits")]
V3 = [("gate_up_v3", "v3"), ("down_v3", "v3")]


def test_prepare_builds_a_v3_copy_sharing_the_biases():
    _, w = make_moe(E, H, H, TOP_K, torch.bfloat16, seed=1, large="v3")
    _, w3 = make_moe(E, H, H, TOP_K, torch.bfloat16, seed=1, kernels="v3")
    _, w2 = make_moe(E, H, H, TOP_K, torch.bfloat16, seed=1, kernels="v2")
    assert (w.layout, w.large.layout, w.large.large) == ("bits", "v3", None)
    for name in ("w13", "s13", "w2", "s2"):
        assert torch.equal(getattr(w, name), getattr(w2, name))
        assert torch.equal(getattr(w.large, name), getattr(w3, name))
    assert w.large.b13 is w.b13 and w.large.b2 is w.b2
    assert w2.large is None


def test_prepare_rejects_a_large_copy_in_the_same_layout():
    args = [torch.zeros(1)] * 6  # rejected before any shape check
    with pytest.raises(ValueError, match="large must be another layout than 'v2', got 'v2'"):
        prepare_moe_weights(*args, kernels="v2", large="v2")
    with pytest.raises(ValueError, match="got 'v4'"):
        prepare_moe_weights(*args, large="v4")


def _stub(e: int, large: MoEWeights | None) -> MoEWeights:
    z = torch.zeros(e, 2, 32, 16, dtype=torch.uint8)
    return MoEWeights(z, z, z, z, z, z, layout="bits", large=large)


def test_for_rows_default_gives_every_batch_the_v3_copy():
    """Since v21 the v3 copy runs every M-tile batch (the v2 copy serves the decode kernels, which
    moe_forward asks before for_rows); the threshold still counts rows an expert, cdiv(T*k, E)."""
    assert moe_layout.LARGE_MIN_ROWS == 1
    big = _stub(32, None)
    w = _stub(32, big)
    for t in (1, 17, 512, 513, 1000, 16384):
        assert for_rows(w, t, 4) is big
    alone = _stub(32, None)
    assert for_rows(alone, 16384, 4) is alone  # no second copy: always the primary


def test_for_rows_threshold_counts_rows_an_expert(monkeypatch):
    """20b: E 32, top-4; at 65 rows (GPTOSS_MOE_LARGE_MIN_ROWS=65, the default until v21) T 512 is
    64 rows and T 513 is cdiv(2052, 32) = 65."""
    monkeypatch.setattr(moe_layout, "LARGE_MIN_ROWS", 65)
    big = _stub(32, None)
    w = _stub(32, big)
    assert for_rows(w, 512, 4) is w
    assert for_rows(w, 513, 4) is big


@pytest.mark.parametrize(("tokens", "want"), [(1, V2), (14, V2), (15, V3), (40, V3)])
def test_forward_picks_the_copy_by_rows_and_matches_the_reference(tokens, want, ran):
    ref, w = make_moe(E, H, H, TOP_K, torch.bfloat16, seed=tokens, large="v3")
    check_against_reference(ref, w, (torch.randn(tokens, H, device=DEV) * 3).bfloat16())
    assert ran == want


@pytest.mark.parametrize(("tokens", "want"), [(1, DEC), (16, DEC)])
def test_decode_sizes_take_the_decode_path_on_the_primary_copy(tokens, want, ran, monkeypatch):
    monkeypatch.setattr(moe_decode, "MAX_T", 16)
    ref, w = make_moe(E, H, H, TOP_K, torch.bfloat16, seed=tokens, large="v3")
    check_against_reference(ref, w, (torch.randn(tokens, H, device=DEV) * 3).bfloat16())
    assert ran == want


@pytest.mark.parametrize(("tokens", "want"), [(3, V2), (20, V3)])
def test_lora_forward_picks_the_copy_by_rows_and_matches_the_reference(tokens, want, ran):
    from tests.gptoss.kernels.test_moe_lora_kernel import adapter, check, stack_of

    ref, w = make_moe(E, H, H, TOP_K, torch.bfloat16, seed=11, large="v3")
    stack = stack_of([adapter("a", 4, 1), adapter("b", 8, 2)], torch.bfloat16)
    x = (torch.randn(tokens, H, generator=torch.Generator().manual_seed(3)) * 3).to(DEV, torch.bfloat16)
    index = torch.arange(tokens, device=DEV) % 3
    check(ref, w, stack, x, index)
    assert ran == want


@pytest.mark.parametrize(
    ("device_gb", "mode", "want", "msg"),
    [
        (80, "auto", ("v2", "v3"), "v2 and a second (v3) copy for large batches"),
        (40, "auto", ("v3", None), "one copy (v3) only"),
        (40, "v2", ("v2", None), "one copy (v2) only"),
        (80, "v2", ("v2", "v3"), "v2 and a second (v3) copy for large batches"),
    ],
)
def test_kernel_model_builds_the_v3_copy_when_experts_take_under_a_quarter(
    device_gb, mode, want, msg, monkeypatch, caplog
):
    """20b-like: 24 layers x 0.5 GB of experts = 12 GB; 80 GB device -> two copies, 40 GB -> one:
    v3 by default (GPTOSS_MOE_KERNELS unset), v2 when GPTOSS_MOE_KERNELS=v2."""
    from types import SimpleNamespace

    from gptoss import kernel_layers

    class FakeTensor:  # 0.125 GB, on "CUDA"
        is_cuda, device = True, "cuda:0"

        def numel(self) -> int:
            return 125_000_000

        def element_size(self) -> int:
            return 1

    t = FakeTensor()
    ex = SimpleNamespace(gate_up_blocks=t, gate_up_scales=t, down_blocks=t, down_scales=t)
    ref = SimpleNamespace(layers=[SimpleNamespace(mlp=SimpleNamespace(experts=ex))] * 24)
    props = SimpleNamespace(total_memory=device_gb * 10**9)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    monkeypatch.setattr(moe_layout, "MODE", mode)
    with caplog.at_level("INFO", logger="gptoss.kernel_layers"):
        assert kernel_layers.moe_layouts(ref) == want
    assert caplog.messages == [f"MoE experts 12.0 GB, device {device_gb:.1f} GB: {msg}"]
    # what the KV cache leaves free for that copy (it is sized before the copy is built)
    assert kernel_layers.large_copy_bytes(ref) == (12 * 10**9 if want[1] else 0)


@pytest.mark.parametrize(
    ("expert_gb", "device_gb", "kernels", "want"),
    [(12.0, 80.0, "v2", "v3"), (61.0, 141.0, "v2", None), (12.0, 80.0, "v1", None), (19.9, 80.0, "v2", "v3")],
)
def test_large_copy_only_for_v2_and_under_a_quarter_of_the_device(
    expert_gb, device_gb, kernels, want, monkeypatch
):
    monkeypatch.setattr(moe_layout, "KERNELS", kernels)
    assert moe_layout.large_copy(int(expert_gb * 1e9), int(device_gb * 1e9)) == want


@pytest.mark.parametrize(
    ("mode", "kernels", "want"),
    [("auto", "v2", ("v3", None)), ("v2", "v2", ("v2", "v3")), ("v3", "v3", ("v3", None))],
)
def test_inside_vllm_the_experts_take_one_v3_copy_unless_told(mode, kernels, want, monkeypatch):
    """moe_layout.vllm_layouts (gptoss.vllm_moe): 20b's 12 GB of experts on an 80 GB card. The engine
    keeps v2 + a v3 copy there; inside vLLM the default is one v3 copy (vLLM's KV cache gets what our
    weights leave), and GPTOSS_MOE_KERNELS=v2|v3 chooses as in the engine."""
    monkeypatch.setattr(moe_layout, "MODE", mode)
    monkeypatch.setattr(moe_layout, "KERNELS", kernels)
    assert moe_layout.vllm_layouts(12 * 10**9, 80 * 10**9) == want
    if mode == "auto":
        assert moe_layout.layouts(12 * 10**9, 80 * 10**9) == ("v2", "v3")  # the engine's


def test_warm_moe_runs_every_power_of_two_up_to_the_step_size(monkeypatch):
    """kernel_warm.warm_moe: the MoE at 2^k - 1 and 2^k tokens from 32 up and at the step's own size, so
    every tile bucket and alignment a step can reach is compiled before the first request."""
    from types import SimpleNamespace

    from gptoss import kernel_warm

    seen: list[tuple[int, torch.dtype]] = []
    monkeypatch.setattr(kernel_warm, "moe_forward", lambda x, *rest: seen.append((x.shape[0], x.dtype)))
    lay = SimpleNamespace(router_w=None, router_b=None, moe=None)
    fake = SimpleNamespace(
        layers=[lay],
        embed=torch.zeros(8, 16, dtype=torch.bfloat16),
        top_k=4,
        alpha=1.702,
        limit=7.0,
        batch_invariant=False,
    )
    kernel_warm.warm_moe(fake, 300)
    assert [n for n, _ in seen] == [31, 32, 63, 64, 127, 128, 255, 256, 300]
    assert {d for _, d in seen} == {torch.bfloat16}
    seen.clear()
    kernel_warm.warm_moe(fake, 16)
    assert seen == [(16, torch.bfloat16)]


def test_decode_copy_picks_the_copy_the_engine_decodes_on(monkeypatch):
    """kernel_model.decode_copy (the engine's decode step and bench/kernels/moe_gpu.py's "engine" rows):
    20b's two copies give DECODE_ON_LARGE's batch sizes the v3 copy, the other sizes up to
    moe_decode.MAX_T the v2 decode kernels, more tokens no decode path; an expert adapter keeps
    every decode batch on v2; one v3 copy (120b) decodes on itself."""
    from gptoss import kernel_model

    _, w = make_moe(E, H, H, TOP_K, torch.bfloat16, seed=1, large="v3")
    _, w3 = make_moe(E, H, H, TOP_K, torch.bfloat16, seed=1, kernels="v3")
    x = lambda t: torch.zeros(t, H, device=DEV)  # noqa: E731
    monkeypatch.setattr(moe_decode, "MAX_T", 16)
    monkeypatch.setattr(kernel_model, "DECODE_ON_LARGE", frozenset({1, 2, 8}))
    pick = kernel_model.decode_copy
    assert pick(x(1), w) is w.large and pick(x(2), w) is w.large and pick(x(8), w) is w.large
    assert pick(x(4), w) is w and pick(x(16), w) is w
    assert pick(x(17), w) is None and pick(x(1), w, expert_lora=True) is w
    assert pick(x(1), w3) is w3 and pick(x(16), w3) is w3 and pick(x(1), w3, expert_lora=True) is None
    monkeypatch.setattr(kernel_model, "DECODE_ON_LARGE", frozenset())
    assert pick(x(1), w) is w

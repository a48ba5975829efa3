"""gptoss.kernels.moe_router: the router GEMM and the routing in one launch.

Every decision is checked exactly: the kernel stores the rounded logits it routed on, and
route_and_group (the unfused path's routing) must give the same ids, weights, counts and row lists
from them. The logits themselves are F.linear's up to the sum's order: float32 to 1e-5 (ieee dots),
bfloat16 to one rounding step. Without CUDA the kernel runs in Triton's interpreter.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated by triton.jit
pytest.importorskip("triton")

from gptoss.kernels import moe, moe_router, rmsnorm  # noqa: E402
from gptoss.kernels.moe_routing import SINGLE_PROGRAM_MAX_TOKENS, Routing, route_and_group  # noqa: E402
from tests.gptoss.kernels.moekit import (  # noqa: E402, F401 - fixtures used by name
    ALPHA,
    DEV,
    LIMIT,
    TOL,
    check_against_reference,
    gpu,
    interpreter_like_the_gpu,
    make_moe,
    poisoned_buffers,
    pytestmark,
)


def _router(t: int, e: int, h: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator(DEV).manual_seed(seed)
    x = (torch.randn(t, h, generator=g, device=DEV) * 2).to(dtype)
    w = (torch.randn(e, h, generator=g, device=DEV) * h**-0.5).to(dtype)
    b = (torch.randn(e, generator=g, device=DEV) * 0.5).to(dtype)
    return x, w, b


def _lists(r: Routing) -> list[list[int]]:
    return [sorted(r.rows[e, : r.counts[e]].tolist()) for e in range(r.counts.shape[0])]


def _fused_with_logits(x, w, b, k) -> tuple[Routing, torch.Tensor]:
    logits = torch.full((x.shape[0], w.shape[0]), float("nan"), dtype=x.dtype, device=DEV)
    return moe_router.router_route(x, w, b, k, logits=logits), logits


@pytest.mark.parametrize(
    "t, e, h, k, dtype",
    [
        (65, 8, 160, 4, torch.bfloat16),  # 5 programs, the last with one token; K tiles 64, 64, 32
        (100, 32, 128, 4, torch.float32),
        (130, 32, 96, 1, torch.bfloat16),
        (70, 20, 64, 3, torch.float32),  # E and k not powers of two: BE 32, KP 4
    ],
)
def test_every_decision_is_the_unfused_routing_of_the_logits_it_stored(t, e, h, k, dtype):
    x, w, b = _router(t, e, h, dtype, seed=t)
    r, logits = _fused_with_logits(x, w, b, k)
    want = F.linear(x, w, b)
    if dtype == torch.float32:
        torch.testing.assert_close(logits, want, rtol=1e-5, atol=1e-5)
    else:  # one bf16 step (2^-8 relative) at most: F.linear rounds its own float32 sum
        torch.testing.assert_close(logits.float(), want.float(), rtol=2**-7, atol=1e-2)
    u = route_and_group(logits, k)
    assert torch.equal(r.ids, u.ids)
    # the same topk_values on the same values; compiled into another kernel its exp and division
    # may round otherwise (an H100, v71: a few float32 ulps), so bit-equal on CPU only
    torch.testing.assert_close(r.weights, u.weights, rtol=1e-6, atol=0)
    assert torch.equal(r.counts, u.counts)
    assert r.counts.sum().item() == t * k
    assert _lists(r) == _lists(u)  # every assignment t*k + j once, in its expert's list


def test_float32_logits_route_as_torch_topk_of_f_linear():
    x, w, b = _router(96, 16, 128, torch.float32, seed=5)
    r = moe_router.router_route(x, w, b, 4)
    top = torch.topk(F.linear(x, w, b), 4, dim=-1)  # random float32 logits: no near ties
    assert torch.equal(r.ids.long(), top.indices)
    torch.testing.assert_close(r.weights, torch.softmax(top.values, dim=-1), rtol=1e-5, atol=1e-6)


def test_an_expert_with_every_token_and_experts_with_none():
    x, w, b = _router(80, 8, 64, torch.bfloat16, seed=3)
    b = torch.tensor([0, 0, 0, 50, 0, 0, -50, -50], dtype=torch.bfloat16, device=DEV)  # 3 always, 6-7 never
    r, logits = _fused_with_logits(x, w, b, 2)
    assert r.counts[3].item() == 80 and r.counts[6].item() == r.counts[7].item() == 0
    assert (r.ids[:, 0] == 3).all()
    assert _lists(r)[3] == [t * 2 for t in range(80)]  # slot 0 of every token
    assert _lists(r) == _lists(route_and_group(logits, 2))


def test_rows_past_t_write_nothing(monkeypatch):
    """T 65 on blocks of 16: the last program's 15 missing tokens store no row."""
    x, w, b = _router(65, 8, 64, torch.bfloat16, seed=9)
    r = Routing.empty(65, 4, 8, DEV)
    r.rows.fill_(-7)
    monkeypatch.setattr(Routing, "empty", classmethod(lambda cls, *a: r))
    assert moe_router.router_route(x, w, b, 4) is r
    for e in range(8):  # each list holds its count's entries, the rest untouched
        assert (r.rows[e, r.counts[e] :] == -7).all()
    assert sorted(r.rows[r.rows >= 0].tolist()) == list(range(65 * 4))


def test_route_tokens_fuses_from_from_t_and_not_when_off(monkeypatch):
    calls = []
    real = moe_router.router_route
    monkeypatch.setattr(
        moe_router, "router_route", lambda *a, **k: calls.append(a[0].shape[0]) or real(*a, **k)
    )
    assert moe_router.FROM_T == SINGLE_PROGRAM_MAX_TOKENS + 1
    for t in (SINGLE_PROGRAM_MAX_TOKENS, SINGLE_PROGRAM_MAX_TOKENS + 1):
        x, w, b = _router(t, 8, 64, torch.float32, seed=t)
        r = moe_router.route_tokens(x, w, b, 4)
        u = route_and_group(F.linear(x, w, b), 4)
        assert torch.equal(r.ids, u.ids) and torch.equal(r.counts, u.counts)
    assert calls == [SINGLE_PROGRAM_MAX_TOKENS + 1]
    monkeypatch.setattr(moe_router, "ENABLED", False)  # GPTOSS_FUSED_ROUTER=0
    moe_router.route_tokens(*_router(100, 8, 64, torch.float32), 4)
    assert calls == [SINGLE_PROGRAM_MAX_TOKENS + 1]


def test_bad_router_arguments_are_refused():
    x, w, b = _router(70, 8, 64, torch.bfloat16)
    with pytest.raises(ValueError, match=r"weight and bias must be x's dtype torch.bfloat16"):
        moe_router.router_route(x, w.float(), b, 4)
    with pytest.raises(ValueError, match=r"need weight \[E, H\], bias \[E\] and 1 <= top_k <= E"):
        moe_router.router_route(x, w[:, :32], b, 4)
    with pytest.raises(ValueError, match=r"1 <= top_k <= E"):
        moe_router.router_route(x, w, b, 9)
    with pytest.raises(ValueError, match=r"logits must be a contiguous \[70, 8\] torch.bfloat16 buffer"):
        moe_router.router_route(x, w, b, 4, logits=torch.empty(70, 8, device=DEV))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_moe_forward_past_the_single_program_routing_matches_the_reference(dtype):
    ref, w = make_moe(8, 64, 64, 4, dtype, seed=11)
    check_against_reference(
        ref, w, (torch.randn(SINGLE_PROGRAM_MAX_TOKENS + 9, 64, device=DEV) * 3).to(dtype)
    )


def test_moe_rows_combined_by_the_next_norm_are_moe_forwards_bits():
    ref, w = make_moe(8, 64, 64, 4, torch.bfloat16, seed=4)
    t = 70
    x = (torch.randn(t, 64, device=DEV) * 3).bfloat16()
    residual = torch.randn(t, 64, device=DEV).bfloat16()
    norm_w = (1 + 0.1 * torch.randn(64, device=DEV)).bfloat16()
    a = (x, ref.router_weight, ref.router_bias, 4, w, ALPHA, LIMIT)
    y, weights = moe.moe_rows(*a)
    assert y.shape == (t * 4, 64) and weights.shape == (t, 4)
    got = rmsnorm.fused_add_rms_norm(y, residual.clone(), norm_w, 1e-5, combine=weights)
    want = rmsnorm.fused_add_rms_norm(moe.moe_forward(*a), residual.clone(), norm_w, 1e-5)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@gpu
@pytest.mark.parametrize("t, e", [(1024, 32), (4096, 32), (1024, 128), (100, 128)])
def test_20b_and_120b_router_shapes_on_gpu(t, e):
    x, w, b = _router(t, e, 2880, torch.bfloat16, seed=e)
    r, logits = _fused_with_logits(x, w, b, 4)
    torch.testing.assert_close(logits.float(), F.linear(x, w, b).float(), rtol=2**-7, atol=2e-2)
    u = route_and_group(logits, 4)
    assert torch.equal(r.ids, u.ids) and torch.equal(r.counts, u.counts)
    torch.testing.assert_close(r.weights, u.weights, rtol=1e-6, atol=0)
    assert _lists(r) == _lists(u)

"""Batch 1's preloading down (gptoss.kernels.moe_v3_down_pre) against the split-K decode down and a
float64 reference, its routing against the gate_up's, and moe.expert_rows_v3's switch to it.

Without CUDA the kernel runs in Triton's interpreter (the portable dequant, no PDL). Tolerances as
test_moe_v3_dec.py: float32 1e-5 (exact dequant, float32 sums in another order), bfloat16 5e-3
against the split-K down, 1e-2 against the reference.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated by triton.jit
pytest.importorskip("triton")

from gptoss.kernels import moe, moe_v3_dec, moe_v3_dec_gu, moe_v3_down_pre  # noqa: E402
from gptoss.kernels.moe_routing import Routing, route_and_group  # noqa: E402
from tests.gptoss.kernels.moekit import (  # noqa: E402, F401 - the fixtures apply here too
    ALPHA,
    DEV,
    LIMIT,
    TOL,
    gpu,
    interpreter_like_the_gpu,
    make_moe,
    poisoned_buffers,
    pytestmark,
)
from tests.gptoss.kernels.test_moe_v3_dec import TOL_V3, _rel, _want  # noqa: E402


def _one_token(e: int, h: int, i: int, k: int, dtype: torch.dtype, seed: int):
    """A v3 MoE, one token's router logits, its routing and random act rows [k, I]."""
    ref, w = make_moe(e, h, i, k, dtype, seed=seed, kernels="v3")
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(1, h, generator=g) * 3).to(DEV, dtype)
    logits = F.linear(x, ref.router_weight, ref.router_bias).contiguous()
    r = route_and_group(logits, k)
    act = torch.randn(k, i, generator=g).to(DEV, dtype)
    return ref, w, logits, r, act


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "e, h, i, k, tile",
    [
        (8, 160, 160, 4, (16, 2)),  # K 160: chunks 2 + 1 (a tile of 1, none masked); H 10 row blocks
        (4, 96, 2880, 2, (32, 4)),  # I 2880: 32 + 16 chunks, 3 masked; the 2nd row block past H
        (6, 128, 192, 3, (64, 4)),  # K 192: chunks 2 + 1; BN 64 over H 128
        (32, 64, 64, 4, (16, 1)),  # one chunk, no second tile; 20b's 32 experts, top-4
    ],
)
def test_down_v3_pre_matches_the_split_k_down_and_the_reference(e, h, i, k, tile, dtype):
    ref, w, logits, r, act = _one_token(e, h, i, k, dtype, seed=e + i)
    got = moe_v3_down_pre.down_v3_pre(act, r, w, logits, tile)
    assert got.shape == (k, h) and got.dtype == dtype
    assert _rel(got, moe_v3_dec.down_v3_dec(act, r, w)) <= TOL_V3[dtype]
    assert _rel(got, _want(ref, r, act)) <= TOL[dtype]


def test_each_slot_takes_the_gate_ups_choice_not_the_routings_order():
    """Slot s is the s-th choice of the logits (the gate_up's _topk_one), which is not expert order:
    swapping two ids in r changes nothing here (the kernel routes the logits itself), while the
    slots' rows follow the choices."""
    ref, w, logits, r, act = _one_token(8, 64, 128, 4, torch.float32, seed=5)
    assert r.ids[0].tolist() != sorted(r.ids[0].tolist())
    got = moe_v3_down_pre.down_v3_pre(act, r, w, logits, (16, 2))
    swapped = r.ids.flip(1).contiguous()
    again = moe_v3_down_pre.down_v3_pre(
        act, Routing(swapped, r.weights, r.counts, r.rows), w, logits, (16, 2)
    )
    assert torch.equal(got, again) and _rel(got, _want(ref, r, act)) <= 1e-5


def test_refuses_what_it_cannot_take():
    _, w, logits, r, act = _one_token(4, 64, 64, 2, torch.float32, seed=1)
    with pytest.raises(ValueError, match="one token's 2 act rows and logits"):
        moe_v3_down_pre.down_v3_pre(torch.cat([act, act]), r, w, logits)
    with pytest.raises(ValueError, match="BN 24 must be a power of two"):
        moe_v3_down_pre.down_v3_pre(act, r, w, logits, (24, 2))
    _, w_bits = make_moe(4, 64, 64, 2, torch.float32, seed=1, kernels="v2")
    with pytest.raises(ValueError, match="'bits' layout"):
        moe_v3_down_pre.down_v3_pre(act, r, w_bits, logits)


def test_the_tile_and_chunks_from_their_rules():
    assert moe_v3_down_pre.tile_from_env(None) == (16, 4) and moe_v3_down_pre.tile_from_env("64,8") == (64, 8)
    for bad in ("8,4", "48,4", "32", "32,x"):
        with pytest.raises(ValueError, match="GPTOSS_V3_DEC_DOWN_PRELOAD_TILE"):
            moe_v3_down_pre.tile_from_env(bad)
    assert moe_v3_down_pre.chunk_parts(2880) == (32, 16)
    assert moe_v3_down_pre.chunk_parts(64) == (1, 0) and moe_v3_down_pre.chunk_parts(192) == (2, 1)
    with pytest.raises(ValueError, match="K must be positive"):
        moe_v3_down_pre.chunk_parts(0)


def test_expert_rows_v3_takes_it_for_one_routed_token_when_switched_on(monkeypatch):
    """With PRELOAD on, a one-token decode with logits runs gate_up_v3_dec (told to release) and this
    down, the same rows as without it; a two-token batch and calls without logits never take it."""
    ref, w = make_moe(8, 128, 160, 4, torch.float32, seed=3, kernels="v3")
    g = torch.Generator().manual_seed(3)
    calls: list[tuple[str, object]] = []
    real_pre, real_gu = moe_v3_down_pre.down_v3_pre, moe_v3_dec_gu.gate_up_v3_dec

    def pre(*a, **kw):
        calls.append(("pre", None))
        return real_pre(*a, **kw)

    def gu(*a, **kw):
        calls.append(("gate_up", kw.get("release")))
        return real_gu(*a, **kw)

    monkeypatch.setattr(moe_v3_down_pre, "down_v3_pre", pre)
    monkeypatch.setattr(moe_v3_dec_gu, "gate_up_v3_dec", gu)
    for tokens in (1, 2):
        x = (torch.randn(tokens, 128, generator=g) * 3).to(DEV)
        logits = F.linear(x, ref.router_weight, ref.router_bias).contiguous()
        monkeypatch.setattr(moe_v3_down_pre, "PRELOAD", False)
        off, _ = moe.expert_rows_v3_logits(x, logits, 4, w, ALPHA, LIMIT)
        monkeypatch.setattr(moe_v3_down_pre, "PRELOAD", True)
        calls.clear()
        on, _ = moe.expert_rows_v3_logits(x, logits, 4, w, ALPHA, LIMIT)
        want = [("gate_up", True), ("pre", None)] if tokens == 1 else [("gate_up", False)]
        assert calls == want and _rel(on, off) <= 1e-5
    calls.clear()
    x = (torch.randn(1, 128, generator=g) * 3).to(DEV)
    moe.expert_rows_v3(
        x, route_and_group(F.linear(x, ref.router_weight, ref.router_bias), 4), w, ALPHA, LIMIT
    )
    assert ("pre", None) not in calls


@gpu
@pytest.mark.parametrize("e", [32, 128])
def test_down_v3_pre_at_the_models_shapes_on_gpu(e):
    """Compiled (the PTX dequant, PDL) at 20b's and 120b's shapes: H = I = 2880, top-4, bf16."""
    ref, w, logits, r, act = _one_token(e, 2880, 2880, 4, torch.bfloat16, seed=e)
    got = moe_v3_down_pre.down_v3_pre(act, r, w, logits)
    assert _rel(got, moe_v3_dec.down_v3_dec(act, r, w)) <= TOL_V3[torch.bfloat16]
    assert _rel(got, _want(ref, r, act)) <= TOL[torch.bfloat16]

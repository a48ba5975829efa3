"""The v3 layout's split-K decode gate_up (gptoss.kernels.moe_v3_dec_gu) against moe_v3.gate_up_v3 on
the decode tiles and a torch reference (act[a] = swiglu(x[a // k] @ W13_e^T + b13_e), the checkpoint's
weights decoded by gptoss.mxfp4.dequantize, in float64, gptoss.model.swiglu), its routing of the
logits in registers against route_and_group, and its switch TOKENS (the batch sizes that take it).

Without CUDA the kernels run in Triton's interpreter (the portable dequant; the PTX runs in the @gpu
test). Tolerances, relative Frobenius error over act: against the reference as test_moe_v3.py
(float32 1e-5, bfloat16 1e-2). Against gate_up_v3: float32 1e-5 (the same exact products, IEEE
sums in another order). bfloat16: both kernels take the same float32 products, add them in another
order (float32 results within 1e-5 of each other, the float32 bound) and round the SwiGLU of that to
bf16 once, to nearest (relative error <= u = 2^-8 each), so |got - want| <= u |got| + u |want| +
|float32 difference| element by element, and over the tensor <= 2u + 1e-5 = 2^-7 + 1e-5 (every
element one ulp apart at worst; in practice few differ).
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated by triton.jit
pytest.importorskip("triton")

from gptoss.kernels import moe, moe_v3, moe_v3_dec_gu, moe_v3_dec_sizes  # noqa: E402
from gptoss.kernels.moe_routing import Routing, route_and_group  # noqa: E402
from gptoss.kernels.moe_tiles import DecTiles, choose_tiles_v3  # noqa: E402
from gptoss.model import swiglu  # noqa: E402
from gptoss.mxfp4 import dequantize  # noqa: E402
from tests.gptoss.kernels.conftest import count_calls, record_launches  # noqa: E402
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

TOL_V3 = {torch.float32: 1e-5, torch.bfloat16: 2**-7 + 1e-5}  # against gate_up_v3 (the docstring)


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    assert not got.isnan().any()
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def _case(e: int, h: int, i: int, k: int, tokens: int, dtype: torch.dtype, seed: int):
    """A v3 MoE whose expert 0 gets every token and expert e - 1 none, random x [T, H] and its
    logits and routing."""
    ref, w = make_moe(e, h, i, k, dtype, seed=seed, kernels="v3")
    ref.router_bias[0], ref.router_bias[e - 1] = 50.0, -50.0
    g = torch.Generator().manual_seed(seed + 1000)  # not make_moe's: x would lie along router rows
    x = (torch.randn(tokens, h, generator=g) * 3).to(DEV, dtype)
    logits = F.linear(x, ref.router_weight, ref.router_bias)
    r = route_and_group(logits, k)
    assert r.counts[0].item() == tokens and r.counts[e - 1].item() == 0
    return ref, w, x, logits, r


def _want(ref, r, x: torch.Tensor) -> torch.Tensor:
    """swiglu(x[a // k] @ W13_e^T + b13_e) in float64, e = the expert of assignment a (the
    checkpoint's rows: gate and up alternate, as gptoss.model.swiglu reads them)."""
    ex, k = ref.experts, r.ids.shape[1]
    ids = r.ids.reshape(-1).long()
    act = torch.empty(ids.shape[0], ex.gate_up_bias.shape[1] // 2, dtype=torch.float64, device=x.device)
    for e in ids.unique().tolist():
        w13 = dequantize(ex.gate_up_blocks[e], ex.gate_up_scales[e], torch.float32).double()  # [2I, H]
        a = (ids == e).nonzero().flatten()
        act[a] = swiglu(x[a // k].double() @ w13.T + ex.gate_up_bias[e].double(), ALPHA, LIMIT)
    return act


def _gate_up_v3(x, r, w) -> torch.Tensor:
    """gate_up_v3 on the decode tiles moe.expert_rows_v3 gives it."""
    (e, _, i), (t, h), k = w.shape, x.shape, r.ids.shape[1]
    return moe_v3.gate_up_v3(x, r, w, ALPHA, LIMIT, choose_tiles_v3(t, k, e, i, h, gate_up=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "tokens, e, h, i, k",
    [
        (1, 8, 128, 96, 4),  # K one 128 step of 2 chunks, one a warp (the default tiles)
        (3, 8, 160, 96, 4),  # K 160 -> 192: a 2nd step whose 2nd chunk is masked
        (16, 8, 256, 64, 4),  # BM 16, the full decode tile; K 256: 2 whole steps
    ],
)
def test_gate_up_v3_dec_matches_gate_up_v3_and_the_reference(tokens, e, h, i, k, dtype):
    ref, w, x, _, r = _case(e, h, i, k, tokens, dtype, seed=tokens)
    got = moe_v3_dec_gu.gate_up_v3_dec(x, r, w, ALPHA, LIMIT)
    assert got.shape == (tokens * k, i) and got.dtype == dtype
    assert _rel(got, _gate_up_v3(x, r, w)) <= TOL_V3[dtype]
    assert _rel(got, _want(ref, r, x)) <= TOL[dtype]


@pytest.mark.parametrize(
    "tiles",
    [
        None,  # V3_GATE_UP_DEC fitted: BM 8, BK 256 (a last step of 1 chunk and 3 masked)
        DecTiles(16, 32, 128, 2, 2, 4),  # the default before v36: a last step of 1 chunk and 1 masked
        DecTiles(16, 32, 512, 4, 4, 3),  # the down's: BK 512, a last step of 5 chunks and 3 masked
        DecTiles(16, 32, 512, 2, 2, 3),  # "v3-dd-gu-w-k512w2": 4 chunks a warp, the last step 5 and 3 masked
        DecTiles(16, 16, 256, 2, 2, 2),  # BN 16: 8 act columns a program; BK 256: 1 chunk, 3 masked
        DecTiles(16, 64, 256, 2, 2, 4),  # BN 64 on 2 warps: 32 act columns a program
        DecTiles(16, 128, 256, 4, 4, 2),  # BN 128: half the block past 2I = 192; 1 chunk a warp
        DecTiles(2, 32, 128, 1, 4, 2),  # no split; BM 2 < T 5: an expert's rows loop over 3 chunks
    ],
)
def test_gate_up_v3_dec_tiles_and_the_k_2880_tail(tiles):
    """H = 2880 = 45 chunks of 64 and I = 96, float32 so any misplaced value shows. The tiles fit an
    H100's shared memory in float32 too (its dequantized weights pass through shared memory)."""
    ref, w, x, _, r = _case(4, 2880, 96, 2, 5, torch.float32, seed=2)
    got = moe_v3_dec_gu.gate_up_v3_dec(x, r, w, ALPHA, LIMIT, tiles)
    assert _rel(got, _want(ref, r, x)) <= 1e-5


@pytest.mark.parametrize("one", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "tokens, tiles, launches",
    [
        (1, None, 0),
        (5, None, 0),
        (16, DecTiles(16, 32, 256, 2, 2, 4), 0),  # BM 16: one x tile holds the batch
        (16, None, 1),  # V3_GATE_UP_DEC_BIG: BM 8, two x tiles: route_and_group's launch first
        (9, None, 1),
        (8, None, 0),  # V3_GATE_UP_DEC_BIG from 8 tokens: one x tile of 8 holds the batch
    ],
)
def test_gate_up_v3_dec_routing_the_logits_matches_route_and_group(
    tokens, tiles, launches, dtype, one, monkeypatch
):
    """logits=: every program routes them in registers and program (0, 0) stores route_and_group's
    decisions (each expert's rows in increasing order, as the v3 gate_up stores them) into r's empty
    buffers; act is the one the routing kernel's rows give. ROUTE_ONE: one token by _topk_one
    (more tokens keep route_in_registers). A batch past one x tile (T > BM) is routed by
    route_and_group's launch into r's buffers before the kernel, with the same decisions."""
    monkeypatch.setattr(moe_v3_dec_gu, "ROUTE_ONE", one)
    _, w, x, logits, r = _case(8, 160, 96, 4, tokens, dtype, seed=tokens + 10)
    got = Routing.empty(tokens, 4, 8, DEV)
    counted = count_calls(monkeypatch, [(moe_v3_dec_gu, "route_and_group", "route")])
    act = moe_v3_dec_gu.gate_up_v3_dec(x, got, w, ALPHA, LIMIT, tiles, logits=logits)
    assert counted["route"] == launches
    assert torch.equal(got.ids, r.ids) and torch.equal(got.weights, r.weights)
    assert torch.equal(got.counts, r.counts) and int(got.counts.sum()) == 4 * tokens
    for e, c in enumerate(r.counts.tolist()):  # the routing kernel's own order where it ran
        want = r.rows[e, :c].tolist()
        assert got.rows[e, :c].tolist() == (want if launches else sorted(want))
    assert torch.equal(act, moe_v3_dec_gu.gate_up_v3_dec(x, r, w, ALPHA, LIMIT, tiles))


@pytest.mark.parametrize("e", [6, 8])
def test_one_token_routing_takes_route_and_groups_choices_on_ties(e, monkeypatch):
    """_topk_one's packed keys (ROUTE_ONE) choose as _topk does where logits tie (the lower id),
    between -0.0 and +0.0 (equal), among negative logits, and past E < BE (6 of 8: never chosen)."""
    monkeypatch.setattr(moe_v3_dec_gu, "ROUTE_ONE", True)
    ones = record_launches(monkeypatch, moe_v3_dec_gu, "_gate_up_v3_dec_kernel", "ONE")  # packed keys ran
    _, w, x, _, _ = _case(e, 160, 96, 4, 1, torch.float32, seed=30)
    rows = [
        [-0.0, 0.0, -1.5, 0.0, -0.0, -3.0, 0.0, 2.0][:e],  # ties at 0 of both signs, behind 2.0
        [-2.0, -1.0, -1.0, -4.0, -1.0, -0.5, -9.0, -1.0][:e],  # all negative, a 4-way tie
        [1.0] * e,  # every expert ties: ids 0..3
    ]
    for vals in rows:
        logits = torch.tensor([vals], dtype=torch.float32, device=DEV)
        want = route_and_group(logits, 4)
        got = Routing.empty(1, 4, e, DEV)
        act = moe_v3_dec_gu.gate_up_v3_dec(x, got, w, ALPHA, LIMIT, logits=logits)
        assert got.ids.tolist() == want.ids.tolist(), vals
        assert torch.equal(got.weights, want.weights) and torch.equal(got.counts, want.counts)
        for ex, c in enumerate(want.counts.tolist()):
            assert got.rows[ex, :c].tolist() == want.rows[ex, :c].tolist()
        assert torch.equal(act, moe_v3_dec_gu.gate_up_v3_dec(x, want, w, ALPHA, LIMIT))
    assert ones == [True, False] * len(rows)  # routed in the kernel: ONE; from route_and_group: not


def test_gate_up_v3_dec_refuses_logits_of_another_shape():
    _, w, x, logits, r = _case(8, 160, 96, 4, 5, torch.bfloat16, seed=1)
    with pytest.raises(ValueError, match="logits \\(5, 4\\) must be \\[T, E\\] rows"):
        moe_v3_dec_gu.gate_up_v3_dec(x, r, w, ALPHA, LIMIT, logits=logits[:, :4])
    # routed by its own launch (T 5 > BM 4): route_and_group's check of r's buffers
    with pytest.raises(
        ValueError,
        match=r"route: out's buffers ids \(5, 4\), counts \(8,\), rows \(8, 5\) do not fit T 5, top-4 of E 4",
    ):
        moe_v3_dec_gu.gate_up_v3_dec(
            x, r, w, ALPHA, LIMIT, DecTiles(4, 32, 512, 4, 4, 3), logits=logits[:, :4]
        )


@pytest.mark.parametrize("kernels, layout", [("v3ds", "v3ds"), ("v2", "bits")])
def test_gate_up_v3_dec_refuses_other_layouts(kernels, layout):
    _, w = make_moe(4, 64, 64, 2, torch.bfloat16, seed=0, kernels=kernels)
    x = torch.randn(3, 64, device=DEV).bfloat16()
    r = route_and_group(torch.randn(3, 4, device=DEV), 2)
    with pytest.raises(
        ValueError, match=f"gate_up_v3_dec: weights in the '{layout}' layout; it reads the 'v3'"
    ):
        moe_v3_dec_gu.gate_up_v3_dec(x, r, w, ALPHA, LIMIT)


@pytest.mark.parametrize(
    "sizes, tokens, calls",
    [
        ({1}, 1, 1),
        ({1}, 2, 0),
        ({16}, 16, 1),
        ({12}, 12, 1),  # past 8 tokens: BM 8, the logits routed by route_and_group's launch first
        (set(), 1, 0),
        ({1, 2, 5, 8}, 4, 0),
        ({1, 2, 5, 8}, 5, 1),
    ],
)
def test_expert_rows_v3_takes_the_split_k_gate_up_at_its_batch_sizes(sizes, tokens, calls, monkeypatch):
    """moe_v3_dec_gu.TOKENS (default moe_v3_dec_sizes.SPLIT_K_TOKENS): expert_rows_v3 runs the kernel for
    T in TOKENS only, routing the logits in it when given, and its rows equal v3's tiles' (none)."""
    ref, w, x, logits, r = _case(8, 160, 96, 4, tokens, torch.bfloat16, seed=5)
    monkeypatch.setattr(moe_v3_dec_gu, "TOKENS", frozenset())
    off = moe.expert_rows_v3(x, r, w, ALPHA, LIMIT)
    counted = count_calls(monkeypatch, [(moe_v3_dec_gu, "gate_up_v3_dec", "gu")])
    monkeypatch.setattr(moe_v3_dec_gu, "TOKENS", frozenset(sizes))
    on = moe.expert_rows_v3(x, r, w, ALPHA, LIMIT)
    routed, r2 = moe.expert_rows_v3_logits(x, logits, 4, w, ALPHA, LIMIT)
    assert counted["gu"] == 2 * calls
    assert _rel(on, off) <= TOL_V3[torch.bfloat16]
    assert torch.equal(routed, on) and torch.equal(r2.counts, r.counts)


def test_the_batch_sizes_come_from_the_environment():
    parse = moe_v3_dec_gu._tokens
    assert parse(None) == parse("") == frozenset(range(1, 17)) == moe_v3_dec_sizes.SPLIT_K_TOKENS
    assert (parse("0"), parse("5"), parse("16")) == (frozenset(), {1, 2, 3, 4, 5}, frozenset(range(1, 17)))
    assert parse("1,2,5-8") == frozenset({1, 2, 5, 6, 7, 8}) and parse("3,3-4,16") == frozenset({3, 4, 16})
    assert moe_v3_dec_gu.TOKENS == parse(os.environ.get("GPTOSS_V3_DEC_GATE_UP"))
    for bad in ("17", "x", "-1", "0,1", "1,17", "5-2", "1,,2", "2-"):
        with pytest.raises(
            ValueError,
            match=f"^GPTOSS_V3_DEC_GATE_UP must say which decode batch sizes take the split-K gate_up: "
            f".* got '{bad}'$",
        ):
            parse(bad)


@gpu
@pytest.mark.parametrize("tokens", [1, 4, 16])
def test_gate_up_v3_dec_120b_shapes_on_gpu(tokens):
    """Compiled (the PTX dequant, mma.sync) at 120b's shapes: E 128, H = I = 2880, top-4; with the
    logits routed in the kernel too."""
    ref, w, x, logits, r = _case(128, 2880, 2880, 4, tokens, torch.bfloat16, seed=tokens)
    got = moe_v3_dec_gu.gate_up_v3_dec(x, r, w, ALPHA, LIMIT)
    assert _rel(got, _gate_up_v3(x, r, w)) <= TOL_V3[torch.bfloat16]
    assert _rel(got, _want(ref, r, x)) <= TOL[torch.bfloat16]
    routed = Routing.empty(tokens, 4, 128, DEV)
    act = moe_v3_dec_gu.gate_up_v3_dec(x, routed, w, ALPHA, LIMIT, logits=logits)
    assert torch.equal(routed.counts, r.counts) and torch.equal(act, got)


def test_the_gate_up_takes_cp_async_where_its_copies_would_not_fit(monkeypatch):
    """moe_v3_dec_sizes.split_copies_fit: TMA copies of 1 chunk a warp faulted on an H200 (v58), so those
    tiles go by cp.async (the bits are the same either way)."""
    ref, w, x, _, r = _case(4, 2880, 96, 2, 5, torch.float32, seed=2)

    def no_descriptors(*a):
        raise AssertionError("weight_descriptors called for blocks that do not fit")

    monkeypatch.setattr(moe_v3_dec_gu, "split_copies_fit", lambda t: (t.bn, t.bk) != (16, 128))
    monkeypatch.setattr(moe_v3_dec_gu, "weight_descriptors", no_descriptors)
    got = moe_v3_dec_gu.gate_up_v3_dec(x, r, w, ALPHA, LIMIT, DecTiles(16, 16, 128, 2, 2, 3))
    assert _rel(got, _want(ref, r, x)) <= 1e-5

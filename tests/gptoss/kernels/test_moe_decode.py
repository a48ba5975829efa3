"""The decode MoE path (gptoss.kernels.moe_decode): expert-slot GEMMs, against the reference MoE and
the v2 path.

Without CUDA the kernels run in Triton's interpreter (small shapes, plus 20b's H = I = 2880 at
T = 1, 2). Tolerances (relative Frobenius error) are test_moe_kernel's: float32 1e-5 (summation
order only), bfloat16 1e-2 (bf16 act/y roundings). The router fused with the norm (norm_route.py)
has its own tests: test_norm_route.py.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated by triton.jit
pytest.importorskip("triton")

import triton  # noqa: E402

from gptoss.kernels import moe, moe_decode, moe_tiles  # noqa: E402
from gptoss.kernels.moe_routing import route_and_group  # noqa: E402
from gptoss.kernels.moe_tiles import DecTiles  # noqa: E402
from tests.gptoss.kernels.conftest import count_calls  # noqa: E402
from tests.gptoss.kernels.moekit import (  # noqa: E402, F401 - fixtures used by name
    ALPHA,
    DEV,
    LIMIT,
    TOL,
    interpreter_like_the_gpu,
    make_moe,
    poisoned_buffers,
    reference,
)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _forward(ref, w, x):
    return moe.moe_forward(x, ref.router_weight, ref.router_bias, ref.top_k, w, ALPHA, LIMIT)


@pytest.fixture
def spy(monkeypatch):
    """Counts the decode forwards, so a test knows which path moe_forward took."""
    return count_calls(monkeypatch, [(moe_decode, name, name) for name in ("moe_decode", "experts_dec")])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 2, 3, 5, 16])
def test_decode_matches_the_reference_and_the_v2_path(dtype, tokens, spy, monkeypatch):
    ref, w = make_moe(8, 64, 64, 4, dtype, seed=10 + tokens)
    x = (torch.randn(tokens, 64, device=DEV) * 3).to(dtype)
    got = _forward(ref, w, x)
    assert spy["moe_decode"] == 1 and not got.isnan().any()
    assert _rel(got, reference(ref, x)) <= TOL[dtype]
    monkeypatch.setattr(moe_decode, "ENABLED", False)
    v2 = _forward(ref, w, x)
    assert spy["moe_decode"] == 1  # the switch took the old path
    assert _rel(got, v2) <= TOL[dtype]


def test_past_max_t_and_on_nibble_weights_the_old_path_runs(spy, monkeypatch):
    ref, w = make_moe(8, 64, 64, 4, torch.float32, seed=1)
    monkeypatch.setattr(moe_decode, "MAX_T", 4)
    _forward(ref, w, torch.randn(5, 64, device=DEV))
    assert spy["moe_decode"] == 0
    _forward(ref, w, torch.randn(4, 64, device=DEV))
    assert spy["moe_decode"] == 1
    ref1, w1 = make_moe(8, 64, 64, 4, torch.float32, seed=1, kernels="v1")
    _forward(ref1, w1, torch.randn(2, 64, device=DEV))
    assert spy["moe_decode"] == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_expert_hit_by_every_token_and_the_last_expert(dtype):
    """Expert 0 gets all 16 rows (two BM 8 chunks), expert 7 (the last) is in every token's four."""
    ref, w = make_moe(8, 64, 64, 4, dtype, seed=4)
    ref.router_bias[0] = 100.0  # logits x @ w are ~N(0, 3): 40 apart never swap
    ref.router_bias[7] = 60.0
    ref.router_bias[5] = -60.0
    g = torch.Generator(DEV).manual_seed(4)
    x = (torch.randn(16, 64, generator=g, device=DEV) * 3).to(dtype)
    r = route_and_group(F.linear(x, ref.router_weight, ref.router_bias), 4)
    assert r.counts[0].item() == 16 and r.counts[7].item() == 16 and r.counts[5].item() == 0
    assert (r.ids[:, 0] == 0).all() and (r.ids[:, 1] == 7).all()
    assert _rel(_forward(ref, w, x), reference(ref, x)) <= TOL[dtype]


@pytest.mark.parametrize(
    "gu, dn",
    [
        (DecTiles(16, 32, 512, 4, 4, 3), DecTiles(16, 32, 512, 4, 4, 3)),
        (DecTiles(8, 16, 256, 2, 2, 2), DecTiles(8, 32, 256, 2, 2, 1)),
        (DecTiles(2, 16, 128, 1, 1, 2), DecTiles(4, 16, 128, 1, 2, 3)),
        (DecTiles(1, 16, 256, 2, 2, 4), DecTiles(1, 16, 128, 1, 1, 2)),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_decode_tile_shape_gives_the_same_result(gu, dn, dtype, monkeypatch):
    """K = 160 (a masked tail for BK 128, whole empty slices for BK 512 split 4), N = 96 (partial
    column blocks), 12 tokens: rows past BM 1, 2, 4, 8 loop; moe_forward_from_logits's entry."""
    ref, w = make_moe(8, 160, 96, 4, dtype, seed=7)
    x = (torch.randn(12, 160, device=DEV) * 3).to(dtype)
    monkeypatch.setattr(moe_tiles, "DEC_TILE_OVERRIDE", {True: gu, False: dn})
    logits = F.linear(x, ref.router_weight, ref.router_bias)
    got = moe.moe_forward_from_logits(x, logits, 4, w, ALPHA, LIMIT)
    assert _rel(got, reference(ref, x)) <= TOL[dtype]


def test_tiles_keep_scale_reads_in_the_row_and_warps_on_distinct_weights(monkeypatch):
    monkeypatch.setattr(moe_tiles, "FLAT_FORCED", None)
    flat = moe_tiles.FLAT_PER_SM  # BM 8: the flat kernels (test_moe_decode_flat)
    assert moe_tiles.dec_tiles(False, 2880) == DecTiles(
        8, 32, 512, 4, 4, 3, per_sm=flat
    )  # 6 steps: 96 scales
    assert moe_tiles.dec_tiles(False, 64) == DecTiles(
        8, 32, 512, 4, 4, 3, per_sm=flat
    )  # one 16-byte scale row
    big = DecTiles(8, 16, 1024, 8, 8, 4)
    monkeypatch.setattr(moe_tiles, "DEC_TILE_OVERRIDE", {False: big})
    assert moe_tiles.dec_tiles(False, 2880) == big  # 3 steps of 1024: 3072 = 96 scales
    assert moe_tiles.dec_tiles(False, 2048 + 320) == DecTiles(8, 16, 512, 4, 4, 4)  # 3072 > 2560 of scales
    assert moe_tiles.dec_tiles(False, 64) == DecTiles(8, 16, 512, 4, 4, 4)
    monkeypatch.setattr(moe_tiles, "DEC_TILE_OVERRIDE", {})
    assert moe_tiles.dec_tiles(True, 2880) == DecTiles(8, 16, 512, 4, 4, 4, per_sm=flat)
    assert [moe_tiles.dec_tiles(True, 2880, t).bm for t in (1, 2, 3, 4, 5, 16)] == [1, 2, 4, 4, 8, 8]
    for k in (64, 160, 1000, 2880, 4096):
        for gate_up in (True, False):
            t = moe_tiles.dec_tiles(gate_up, k)
            assert triton.cdiv(k, t.bk) * t.bk <= triton.cdiv(k, 512) * 512
            assert t.bk // t.split >= 128 and t.warps == t.split


@pytest.mark.parametrize("h, i", [(2880, 64), (64, 2880)])
@pytest.mark.parametrize("tokens", [1])
def test_20b_k_dims(h, i, tokens):
    """E 32, top-4 and one GEMM at 20b's K = 2880 (gate_up: a 320 tail for BK 512; down: BK 1024
    in 3 steps) with the other dim small (all of 20b is minutes in the interpreter: the GPU test)."""
    ref, w = make_moe(32, h, i, 4, torch.bfloat16, seed=tokens)
    x = torch.randn(tokens, h, generator=torch.Generator(DEV).manual_seed(tokens), device=DEV).bfloat16()
    assert moe_decode.use_decode(x, w)
    assert _rel(_forward(ref, w, x), reference(ref, x)) <= TOL[torch.bfloat16]


def test_decode_is_deterministic():
    ref, w = make_moe(8, 64, 64, 4, torch.bfloat16, seed=9)
    x = (torch.randn(7, 64, device=DEV) * 3).bfloat16()
    assert torch.equal(_forward(ref, w, x), _forward(ref, w, x))


@pytest.mark.parametrize("gate_up_pdl, down_pdl", [(False, False), (False, True), (True, False)])
def test_decode_gives_the_same_bits_with_or_without_pdl_launches(gate_up_pdl, down_pdl, monkeypatch):
    """moe_decode.PDL_GATE_UP / PDL_DOWN (bench switches; compiled on Hopper the launch attribute and
    the wait change, the arithmetic does not): the same output as both on, routing in gate_up too."""
    ref, w = make_moe(8, 64, 64, 4, torch.bfloat16, seed=9)
    x = (torch.randn(3, 64, device=DEV) * 3).bfloat16()
    want, (_, want_routed, _) = _forward(ref, w, x), _routed_in_gemm(ref, w, x)
    monkeypatch.setattr(moe_decode, "PDL_GATE_UP", gate_up_pdl)
    monkeypatch.setattr(moe_decode, "PDL_DOWN", down_pdl)
    asked, pdl_args = [], moe_decode.pdl.args  # moe_decode's own launches: its module's `pdl`

    def spy(t, launch=True):
        asked.append(launch)
        return pdl_args(t, launch)

    monkeypatch.setattr(moe_decode, "pdl", SimpleNamespace(args=spy))
    assert torch.equal(_forward(ref, w, x), want)
    assert torch.equal(_routed_in_gemm(ref, w, x)[1], want_routed)
    assert asked == [gate_up_pdl, down_pdl] * 2  # each launch took its own switch


@pytest.mark.skipif(DEV.type != "cuda", reason="needs CUDA (compiled kernels)")
@pytest.mark.parametrize("tokens", [1, 2, 3, 4, 8, 16])
def test_20b_shapes_on_gpu(tokens):
    """Compiled: the default tiles (rel error printed)."""
    ref, w = make_moe(32, 2880, 2880, 4, torch.bfloat16, seed=tokens)
    x = torch.randn(tokens, 2880, device=DEV).bfloat16()
    for _ in range(3):  # repeated calls: no state carried between them
        err = _rel(_forward(ref, w, x), reference(ref, x))
        assert err <= TOL[torch.bfloat16]
    print(f"decode T={tokens}: rel error {err:.2e}")


def _routed_in_gemm(ref, w, x):
    logits = F.linear(x, ref.router_weight, ref.router_bias).float()  # [T, E], as norm_logits gives
    y, r = moe_decode.experts_dec_logits(x, logits, ref.top_k, w, ALPHA, LIMIT)
    return logits, y, r


def _assert_same_routing(got, want):
    """ids, weights and counts equal route_and_group's; each expert's list the same assignments, in
    increasing order (route_and_group's order is atomic timing)."""
    assert torch.equal(got.ids, want.ids) and torch.equal(got.weights, want.weights)
    assert torch.equal(got.counts, want.counts)
    for e, c in enumerate(want.counts.tolist()):
        assert got.rows[e, :c].tolist() == sorted(want.rows[e, :c].tolist())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens, experts", [(1, 8), (2, 8), (3, 20), (5, 8), (12, 32), (16, 8)])
def test_routing_inside_gate_up_equals_the_routing_kernel(dtype, tokens, experts, monkeypatch):
    """experts_dec_logits: the Routing that gate_up's program (0, 0) writes equals route_and_group's,
    and y equals experts_dec's rows on it (buffers start poisoned: every row and entry is written)."""
    ref, w = make_moe(experts, 64, 96, 4, dtype, seed=40 + tokens)
    x = (torch.randn(tokens, 64, generator=torch.Generator(DEV).manual_seed(tokens), device=DEV) * 3).to(
        dtype
    )
    want_r = route_and_group(F.linear(x, ref.router_weight, ref.router_bias), 4)
    want_y = moe_decode.experts_dec(x, want_r, w, ALPHA, LIMIT, combined=False)
    full = torch.full

    def poisoned(*size, dtype, device):
        return full(size, float("nan") if dtype.is_floating_point else -7, dtype=dtype, device=device)

    monkeypatch.setattr(torch, "empty", poisoned)
    _, y, r = _routed_in_gemm(ref, w, x)
    monkeypatch.undo()
    _assert_same_routing(r, want_r)
    assert not y.isnan().any()
    assert _rel(y, want_y) <= TOL[dtype] / 100  # the same GEMMs on the same rows, in another column order
    out = moe.combine(y, r.weights, x.dtype)
    assert _rel(out, reference(ref, x)) <= TOL[dtype]


def test_routing_inside_gate_up_ties_and_an_expert_hit_by_every_token():
    """Experts 3 and 4 tie for 4th place (the lower id wins, as the routing kernel); expert 0 gets all
    16 tokens (two BM-8 chunks of its list), expert 7 none."""
    ref, w = make_moe(8, 64, 64, 4, torch.float32, seed=4)
    ref.router_weight[4] = ref.router_weight[3]
    ref.router_bias.copy_(torch.tensor([100.0, 50.0, 40.0, 30.0, 30.0, 0.0, 0.0, -100.0]))
    ref.router_weight.mul_(1e-3)  # logits stay near the bias: the order is the bias's
    x = torch.randn(16, 64, generator=torch.Generator(DEV).manual_seed(4), device=DEV)
    logits, y, r = _routed_in_gemm(ref, w, x)
    assert r.ids.tolist() == [[0, 1, 2, 3]] * 16
    assert r.counts.tolist() == [16, 16, 16, 16, 0, 0, 0, 0]
    assert r.rows[0].tolist() == list(range(0, 64, 4)) and r.rows[3].tolist() == list(range(3, 64, 4))
    _assert_same_routing(r, route_and_group(logits, 4))
    assert _rel(moe.combine(y, r.weights, x.dtype), reference(ref, x)) <= TOL[torch.float32]


def test_routing_inside_gate_up_argument_errors():
    ref, w = make_moe(8, 64, 64, 4, torch.float32, seed=1)
    x = torch.randn(3, 64, device=DEV)
    with pytest.raises(ValueError, match=r"logits \(3, 7\) \(contiguous rows\) and top_k 4 must fit"):
        moe_decode.experts_dec_logits(x, torch.zeros(3, 7, device=DEV), 4, w, ALPHA, LIMIT)
    with pytest.raises(ValueError, match="top_k 9 must fit"):
        moe_decode.experts_dec_logits(x, torch.zeros(3, 8, device=DEV), 9, w, ALPHA, LIMIT)


def test_gate_up_register_cap_applies_to_small_batches_only(monkeypatch):
    """GPTOSS_GATE_UP_MAXNREG (GATE_UP_MAXNREG): gate_up at BM <= 4 gets the cap, BM 8 and down none
    (the capped kernel's results: test_gate_up_register_cap_on_gpu)."""
    monkeypatch.setattr(moe_tiles, "GATE_UP_MAXNREG", 80)
    assert [moe_tiles.dec_tiles(True, 2880, t).maxnreg for t in (1, 2, 4, 5, 16)] == [80, 80, 80, None, None]
    assert moe_tiles.dec_tiles(False, 2880, 1).maxnreg is None
    monkeypatch.setattr(moe_tiles, "GATE_UP_MAXNREG", None)
    assert moe_tiles.dec_tiles(True, 2880, 1).maxnreg is None


@pytest.mark.skipif(DEV.type != "cuda", reason="needs CUDA (compiled kernels)")
@pytest.mark.parametrize("tokens", [1, 2, 4])
def test_gate_up_register_cap_on_gpu(tokens, monkeypatch):
    """Compiled with the cap (spills outside the K loop): bit-equal to the uncapped kernel."""
    ref, w = make_moe(32, 2880, 2880, 4, torch.bfloat16, seed=tokens)
    x = torch.randn(tokens, 2880, device=DEV).bfloat16()
    want = _forward(ref, w, x)
    monkeypatch.setattr(moe_tiles, "GATE_UP_MAXNREG", 80)
    assert torch.equal(_forward(ref, w, x), want)


@pytest.mark.parametrize("probe", [1, 2])
def test_timing_probes_run_and_are_off_by_default(probe, monkeypatch):
    """moe_decode.PROBE (benchmarks only): the load-only and compute-only K steps run through both
    slot kernels and give other numbers than the product; 0, the default, is the product."""
    assert moe_decode.PROBE == 0
    monkeypatch.setattr(moe_tiles, "FLAT_FORCED", 0)
    ref, w = make_moe(8, 160, 96, 4, torch.bfloat16, seed=70)
    x = (torch.randn(3, 160, generator=torch.Generator(DEV).manual_seed(70), device=DEV) * 3).bfloat16()
    want = _forward(ref, w, x)
    monkeypatch.setattr(moe_decode, "PROBE", probe)
    got = _forward(ref, w, x)
    assert got.shape == want.shape and not torch.equal(got.nan_to_num(), want)

"""The v3 layout's split-K decode down (gptoss.kernels.moe_v3_dec) against moe_v3.down_v3 on the
decode tiles and a torch reference (y[a] = act[a] @ W2_e^T + b2_e, the checkpoint's weights decoded
by gptoss.mxfp4.dequantize, in float64), and moe.expert_rows_v3's switch to it.

Without CUDA the kernels run in Triton's interpreter (the portable dequant; the PTX runs in the @gpu
test). Tolerances, relative Frobenius error over the output: float32 1e-5 (exact dequant, IEEE dots:
summation order only), bfloat16 1e-2 as test_moe_v3.py (y rounded to bf16 from float32 sums in
another order); against down_v3 in bf16 both round nearly the same sums, so 5e-3.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated by triton.jit
pytest.importorskip("triton")

from gptoss.kernels import moe, moe_v3, moe_v3_dec, moe_v3_dec_gu, moe_v3_dec_sizes  # noqa: E402
from gptoss.kernels.moe_routing import Routing, route_and_group  # noqa: E402
from gptoss.kernels.moe_tiles import DecTiles, choose_tiles_v3  # noqa: E402
from gptoss.mxfp4 import dequantize  # noqa: E402
from tests.gptoss.kernels.conftest import count_calls  # noqa: E402
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

TOL_V3 = {torch.float32: 1e-5, torch.bfloat16: 5e-3}  # against down_v3


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    assert not got.isnan().any()
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def _case(e: int, h: int, i: int, k: int, tokens: int, dtype: torch.dtype, seed: int):
    """A v3 MoE whose expert 0 gets every token and expert e - 1 none, its routing of random x, and
    random act rows [T*k, I] in assignment order (down's input)."""
    ref, w = make_moe(e, h, i, k, dtype, seed=seed, kernels="v3")
    ref.router_bias[0], ref.router_bias[e - 1] = 50.0, -50.0
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(tokens, h, generator=g) * 3).to(DEV, dtype)
    r = route_and_group(F.linear(x, ref.router_weight, ref.router_bias), k)
    assert r.counts[0].item() == tokens and r.counts[e - 1].item() == 0
    act = torch.randn(tokens * k, i, generator=g).to(DEV, dtype)
    return ref, w, r, act


def _want(ref, r, act: torch.Tensor) -> torch.Tensor:
    """act[a] @ W2_e^T + b2_e in float64, e = the expert of assignment a."""
    ex = ref.experts
    ids = r.ids.reshape(-1).long()
    y = torch.empty(act.shape[0], ex.down_bias.shape[1], dtype=torch.float64, device=act.device)
    for e in ids.unique().tolist():
        w2 = dequantize(ex.down_blocks[e], ex.down_scales[e], torch.float32).double()  # [H, I]
        a = (ids == e).nonzero().flatten()
        y[a] = act[a].double() @ w2.T + ex.down_bias[e].double()
    return y


def _down_v3(act, r, w) -> torch.Tensor:
    """down_v3 on the decode tiles moe.expert_rows_v3 gives it."""
    (e, h, i), (t, k) = w.shape, r.ids.shape
    return moe.down_v3(act, r, w, choose_tiles_v3(t, k, e, h, i, gate_up=False))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "tokens, e, h, i, k",
    [
        (1, 4, 128, 128, 2),  # K one 128 step (BK 128, split 2)
        (3, 8, 160, 160, 4),  # K 160 -> 192: a step of 256 whose 4th chunk is masked
        (5, 6, 128, 192, 3),  # K 192: 3 whole chunks of 4
        (16, 8, 160, 160, 4),  # BM 16: the full decode tile
    ],
)
def test_down_v3_dec_matches_down_v3_and_the_reference(tokens, e, h, i, k, dtype):
    ref, w, r, act = _case(e, h, i, k, tokens, dtype, seed=tokens)
    got = moe_v3_dec.down_v3_dec(act, r, w)
    assert got.shape == (tokens * k, h) and got.dtype == dtype
    assert _rel(got, _down_v3(act, r, w)) <= TOL_V3[dtype]
    assert _rel(got, _want(ref, r, act)) <= TOL[dtype]


def test_one_token_takes_its_experts_from_ids_with_the_lists_bits():
    """T 1 (batch 1's step): slot s computes assignment s of expert ids[0, s], read from the routing's
    ids (ONE_TOKEN) rather than from the counts and row lists, whose slots run in expert order. The
    same bits as the list path (which a strided ids view still takes), with ids not in expert order."""
    ref, w, r, act = _case(8, 160, 160, 4, 1, torch.float32, seed=21)
    assert r.ids[0].tolist() != sorted(r.ids[0].tolist())
    strided = torch.zeros(1, 8, dtype=torch.int32, device=DEV)[:, ::2]
    strided.copy_(r.ids)
    lists = moe_v3_dec.down_v3_dec(act, Routing(strided, r.weights, r.counts, r.rows), w)
    got = moe_v3_dec.down_v3_dec(act, r, w)
    assert torch.equal(got, lists) and _rel(got, _want(ref, r, act)) <= 1e-5


@pytest.mark.parametrize(
    "tiles",
    [
        DecTiles(16, 16, 256, 2, 2, 2),  # BN 16: one row block, 2 warps of 2 chunks
        DecTiles(16, 64, 512, 4, 4, 3),  # BN 64: the 2nd block half past H, 2 chunks a warp
        DecTiles(16, 32, 256, 2, 2, 4),  # the gate_up's default tile: 2 warps of 2 chunks, 4 stages
        DecTiles(2, 32, 128, 1, 4, 2),  # no split; BM 2 < T 5: an expert's rows loop over 3 tiles
        DecTiles(16, 16, 128, 2, 2, 3),  # 2 chunks a copy: cp.async on the GPU, where TMA faulted (v58)
    ],
)
def test_down_v3_dec_tiles_and_the_k_2880_tail(tiles):
    """I = 2880 = 45 chunks of 64 (BK 512: a last step of 5 chunks and 3 masked; BK 256 of 1 and 3
    masked) and H = 96 (3 row blocks), float32 so any misplaced value shows."""
    ref, w, r, act = _case(4, 96, 2880, 2, 5, torch.float32, seed=2)
    got = moe_v3_dec.down_v3_dec(act, r, w, tiles)
    assert _rel(got, _want(ref, r, act)) <= 1e-5


def test_dec_tiles_v3_fit_t_and_k():
    fit = moe_v3_dec.dec_tiles_v3
    assert fit(1, 2880) == DecTiles(1, 32, 512, 4, 4, 3)
    assert fit(2, 2880) == DecTiles(2, 32, 512, 4, 4, 3)
    assert fit(5, 2880) == fit(7, 2880) == DecTiles(8, 32, 512, 4, 4, 3)
    # from 8 tokens V3_DOWN_DEC_BIG's: an x tile of 8 rows, 64 weight rows, at most 128 registers
    big = DecTiles(8, 64, 512, 4, 4, 3, maxnreg=128)
    assert fit(8, 2880) == fit(9, 2880) == fit(16, 2880) == fit(17, 2880) == big
    # and at 3 and 4 tokens (BIG_ALSO), on an x tile of 4 rows
    assert fit(3, 2880) == fit(4, 2880) == DecTiles(4, 64, 512, 4, 4, 3, maxnreg=128)
    # with 128 experts (120b) at 5-7 tokens too (BIG_MANY), on the x tile of 8 rows that 8 tokens take
    assert fit(5, 2880, experts=128) == fit(7, 2880, experts=128) == big
    assert fit(5, 2880, experts=32) == fit(7, 2880, experts=64) == DecTiles(8, 32, 512, 4, 4, 3)
    small, big_gu = moe_v3_dec_gu.V3_GATE_UP_DEC, moe_v3_dec_gu.V3_GATE_UP_DEC_BIG  # the gate_up's alike
    for experts, want in ((32, [3, 4, *range(8, 17)]), (128, list(range(3, 17)))):
        picks = [moe_v3_dec_sizes.batch_tiles(t, small, big_gu, experts) for t in range(1, 17)]
        assert [t for t, p in enumerate(picks, 1) if p == big_gu] == want
    assert fit(16, 160) == DecTiles(8, 64, 256, 4, 4, 3, maxnreg=128)  # K 160 padded to 192: BK 256
    assert fit(16, 96) == DecTiles(8, 64, 128, 2, 2, 3, maxnreg=128)  # 2 chunks: 2 warps
    assert fit(16, 160, DecTiles(16, 32, 512, 4, 4, 3)) == DecTiles(16, 32, 256, 4, 4, 3)
    assert fit(4, 2880, DecTiles(16, 64, 1024, 8, 8, 4)) == DecTiles(4, 64, 1024, 8, 8, 4)
    capped = DecTiles(16, 64, 512, 4, 4, 3, maxnreg=128)  # a register cap stays with the fitted tiles
    assert fit(12, 2880, capped) == DecTiles(16, 64, 512, 4, 4, 3, maxnreg=128)
    for bad in (
        DecTiles(16, 24, 512, 4, 4, 3),
        DecTiles(16, 32, 512, 16, 4, 3),
        DecTiles(12, 32, 512, 4, 4, 3),
    ):
        with pytest.raises(ValueError, match="needs BN a multiple of 16, BK of 64 \\* SPLIT"):
            fit(1, 2880, bad)


def _spy_launches(monkeypatch) -> list[tuple[str, int | None]]:
    """Both split-K kernels' launches from now on, recorded as (kernel, its maxnreg option) as they run."""
    seen = []

    class Spy:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            def launch(*args, **kw):
                seen.append((self.kernel.fn.__name__, kw["maxnreg"]))
                return self.kernel[grid](*args, **kw)

            return launch

    monkeypatch.setattr(moe_v3_dec, "_down_v3_dec_kernel", Spy(moe_v3_dec._down_v3_dec_kernel))
    monkeypatch.setattr(moe_v3_dec_gu, "_gate_up_v3_dec_kernel", Spy(moe_v3_dec_gu._gate_up_v3_dec_kernel))
    return seen


def test_both_split_k_launches_take_the_tiles_register_cap(monkeypatch):
    """A DecTiles.maxnreg reaches ptxas through each launch (Triton's maxnreg option), so a capped tile
    is what runs; uncapped tiles launch with None (no cap)."""
    ref, w, r, act = _case(4, 96, 2880, 2, 5, torch.float32, seed=2)
    seen = _spy_launches(monkeypatch)
    x = torch.randn(5, 96, device=DEV)
    moe_v3_dec_gu.gate_up_v3_dec(x, r, w, 1.702, 7.0, DecTiles(8, 32, 128, 2, 2, 3, maxnreg=96))
    got = moe_v3_dec.down_v3_dec(act, r, w, DecTiles(8, 64, 512, 4, 4, 3, maxnreg=128))
    moe_v3_dec.down_v3_dec(act, r, w, DecTiles(8, 64, 512, 4, 4, 3))
    assert seen == [
        ("_gate_up_v3_dec_kernel", 96),
        ("_down_v3_dec_kernel", 128),
        ("_down_v3_dec_kernel", None),
    ]
    assert _rel(got, _want(ref, r, act)) <= 1e-5


@pytest.mark.parametrize(("experts", "cap"), [(32, None), (128, 128)])
def test_five_tokens_take_the_big_tiles_with_many_experts(experts, cap, monkeypatch):
    """Both GEMMs pass the weights' expert count to batch_tiles: at 5 tokens 128 experts (120b) launch the
    big-batch tiles (their 128-register cap), 32 (20b) the small ones (no cap); the product is right."""
    ref, w, r, act = _case(experts, 64, 64, 4, 5, torch.float32, seed=3)
    seen = _spy_launches(monkeypatch)
    moe_v3_dec_gu.gate_up_v3_dec(torch.randn(5, 64, device=DEV), r, w, 1.702, 7.0)
    got = moe_v3_dec.down_v3_dec(act, r, w)
    assert seen == [("_gate_up_v3_dec_kernel", cap), ("_down_v3_dec_kernel", cap)]
    assert _rel(got, _want(ref, r, act)) <= 1e-5


@pytest.mark.parametrize("kernels, layout", [("v3ds", "v3ds"), ("v2", "bits")])
def test_down_v3_dec_refuses_other_layouts(kernels, layout):
    _, w = make_moe(4, 64, 64, 2, torch.bfloat16, seed=0, kernels=kernels)
    x = torch.randn(3, 64, device=DEV).bfloat16()
    r = route_and_group(torch.randn(3, 4, device=DEV), 2)
    with pytest.raises(ValueError, match=f"down_v3_dec: weights in the '{layout}' layout; it reads the 'v3'"):
        moe_v3_dec.down_v3_dec(x.new_zeros(6, 64), r, w)


@pytest.mark.parametrize(
    "sizes, tokens, calls",
    [({1}, 1, 1), ({1}, 2, 0), ({16}, 16, 1), (set(range(1, 17)), 17, 0), (set(), 1, 0), ({2, 8}, 4, 0)],
)
def test_expert_rows_v3_takes_the_decode_down_at_its_batch_sizes(sizes, tokens, calls, monkeypatch):
    """moe_v3_dec.TOKENS (default SPLIT_K_TOKENS: the sizes where the engine measured it faster): the
    kernel runs for T in TOKENS only, with the same rows as v3's down tiles (none)."""
    ref, w = make_moe(8, 160, 96, 4, torch.bfloat16, seed=3, kernels="v3")
    x = (torch.randn(tokens, 160, generator=torch.Generator().manual_seed(4)) * 3).to(DEV, torch.bfloat16)
    r = route_and_group(F.linear(x, ref.router_weight, ref.router_bias), 4)
    monkeypatch.setattr(moe_v3_dec, "TOKENS", frozenset())
    off = moe.expert_rows_v3(x, r, w, ALPHA, LIMIT)
    counted = count_calls(monkeypatch, [(moe_v3_dec, "down_v3_dec", "dec")])
    monkeypatch.setattr(moe_v3_dec, "TOKENS", frozenset(sizes))
    on = moe.expert_rows_v3(x, r, w, ALPHA, LIMIT)
    assert counted["dec"] == calls
    assert _rel(on, off) <= TOL_V3[torch.bfloat16]


def test_the_batch_sizes_come_from_the_environment():
    assert moe_v3_dec_sizes.SPLIT_K_TOKENS == frozenset(range(1, 17))  # every decode batch size since v62
    parsed = [moe_v3_dec._tokens(v) for v in (None, "", "0", "1", "2,8", "16")]
    assert parsed == [moe_v3_dec_sizes.SPLIT_K_TOKENS] * 2 + [frozenset(), {1}, {2, 8}, set(range(1, 17))]
    assert moe_v3_dec.TOKENS == moe_v3_dec._tokens(os.environ.get("GPTOSS_V3_DEC_DOWN"))
    for bad in ("17", "yes", "-1", "4-3"):
        with pytest.raises(ValueError, match=f"^GPTOSS_V3_DEC_DOWN must say .* split-K down: .* '{bad}'$"):
            moe_v3_dec._tokens(bad)


def test_expert_rows_v3_switch_with_routed_logits_and_sorted_rows(monkeypatch):
    """Logits routed in gate_up (rows in assignment order): the decode down. Rows expert by expert
    (moe_v3.TMA_DOWN: act sorted for down's TMA): down_v3, whose act the kernel cannot read."""
    ref, w = make_moe(8, 160, 96, 4, torch.bfloat16, seed=5, kernels="v3")
    x = (torch.randn(4, 160, generator=torch.Generator().manual_seed(6)) * 3).to(DEV, torch.bfloat16)
    logits = F.linear(x, ref.router_weight, ref.router_bias)
    monkeypatch.setattr(moe_v3_dec, "TOKENS", frozenset())
    off, _ = moe.expert_rows_v3_logits(x, logits, 4, w, ALPHA, LIMIT)
    calls = count_calls(monkeypatch, [(moe_v3_dec, "down_v3_dec", "dec")])
    monkeypatch.setattr(moe_v3_dec, "TOKENS", frozenset(range(1, 17)))
    on, _ = moe.expert_rows_v3_logits(x, logits, 4, w, ALPHA, LIMIT)
    assert calls["dec"] == 1 and _rel(on, off) <= TOL_V3[torch.bfloat16]
    monkeypatch.setattr(moe_v3, "tma_plan", lambda x, lora=None: (True, False))
    sorted_y = moe.expert_rows_v3(x, route_and_group(logits, 4), w, ALPHA, LIMIT)
    assert calls["dec"] == 1 and _rel(sorted_y, off) <= TOL_V3[torch.bfloat16]


@gpu
@pytest.mark.parametrize("tokens", [1, 4, 16])
def test_down_v3_dec_120b_shapes_on_gpu(tokens):
    """Compiled (the PTX dequant, mma.sync) at 120b's shapes: E 128, H = I = 2880, top-4."""
    ref, w, r, act = _case(128, 2880, 2880, 4, tokens, torch.bfloat16, seed=tokens)
    got = moe_v3_dec.down_v3_dec(act, r, w)
    assert _rel(got, _down_v3(act, r, w)) <= TOL_V3[torch.bfloat16]
    assert _rel(got, _want(ref, r, act)) <= TOL[torch.bfloat16]


def test_decode_tiles_come_from_the_environment(monkeypatch):
    for name, tiles, want in [
        ("GPTOSS_V3_DEC_DOWN_TILES", moe_v3_dec.V3_DOWN_DEC, DecTiles(16, 32, 512, 4, 4, 3)),
        ("GPTOSS_V3_DEC_DOWN_TILES_BIG", moe_v3_dec.V3_DOWN_DEC_BIG, DecTiles(8, 64, 512, 4, 4, 3, 128)),
        ("GPTOSS_V3_DEC_GATE_UP_TILES", moe_v3_dec_gu.V3_GATE_UP_DEC, DecTiles(16, 32, 256, 2, 2, 4)),
        (
            "GPTOSS_V3_DEC_GATE_UP_TILES_BIG",
            moe_v3_dec_gu.V3_GATE_UP_DEC_BIG,
            DecTiles(8, 64, 256, 4, 4, 3, 128),
        ),
    ]:
        assert tiles == moe_v3_dec_sizes.env_dec_tiles(name, want)  # the default unless the run sets it
    default = DecTiles(16, 32, 512, 4, 4, 3)
    monkeypatch.delenv("GPTOSS_X_TILES", raising=False)
    assert moe_v3_dec_sizes.env_dec_tiles("GPTOSS_X_TILES", default) is default
    monkeypatch.setenv("GPTOSS_X_TILES", "16,32,128,2,2,4")
    assert moe_v3_dec_sizes.env_dec_tiles("GPTOSS_X_TILES", default) == DecTiles(16, 32, 128, 2, 2, 4)
    monkeypatch.setenv("GPTOSS_X_TILES", "8,64,512,4,4,3,r128")  # a register cap
    assert moe_v3_dec_sizes.env_dec_tiles("GPTOSS_X_TILES", default) == DecTiles(
        8, 64, 512, 4, 4, 3, maxnreg=128
    )
    for bad, why in [
        ("16,32,128,2,2", "six positive counts"),
        ("16,24,128,2,2,4", "BN a multiple of 16"),
        ("8,64,512,4,4,3,128", "optionally rNREG"),  # a cap without its r
        ("8,64,512,4,4,3,r", "optionally rNREG"),
    ]:
        monkeypatch.setenv("GPTOSS_X_TILES", bad)
        with pytest.raises(ValueError, match=f"GPTOSS_X_TILES.*{why}"):
            moe_v3_dec_sizes.env_dec_tiles("GPTOSS_X_TILES", default)


def test_copies_of_one_chunk_a_warp_go_by_cp_async_on_the_gpu(monkeypatch):
    """split_copies_fit: BN 16 at BK 128 over 2 warps (1 chunk a warp) faulted on an H200 (v58); tiles
    of 2 chunks a warp or more ran. The interpreter copies any block."""
    tiles = [
        DecTiles(16, 16, 128, 2, 2, 3),  # faulted
        DecTiles(16, 16, 256, 4, 4, 3),  # 1 chunk a warp too
        DecTiles(16, 16, 256, 2, 2, 3),  # ran
        DecTiles(16, 32, 128, 2, 2, 3),  # ran
        DecTiles(1, 32, 64, 1, 4, 2),  # ran
        DecTiles(16, 32, 512, 4, 4, 3),  # the down's default
    ]
    monkeypatch.setattr(moe_v3_dec_sizes.triton.knobs.runtime, "interpret", True)
    assert all(moe_v3_dec_sizes.split_copies_fit(t) for t in tiles)
    monkeypatch.setattr(moe_v3_dec_sizes.triton.knobs.runtime, "interpret", False)
    assert [moe_v3_dec_sizes.split_copies_fit(t) for t in tiles] == [False, False, True, True, True, True]


def test_the_down_takes_cp_async_where_its_copies_would_not_fit(monkeypatch):
    ref, w, r, act = _case(4, 96, 2880, 2, 5, torch.float32, seed=2)

    def no_descriptors(*a):
        raise AssertionError("weight_descriptors called for blocks that do not fit")

    monkeypatch.setattr(moe_v3_dec, "split_copies_fit", lambda t: (t.bn, t.bk) != (16, 128))
    monkeypatch.setattr(moe_v3_dec, "weight_descriptors", no_descriptors)
    got = moe_v3_dec.down_v3_dec(act, r, w, DecTiles(16, 16, 128, 2, 2, 3))
    assert _rel(got, _want(ref, r, act)) <= 1e-5
    with pytest.raises(AssertionError, match="called for blocks"):  # the default tiles still copy by TMA
        moe_v3_dec.down_v3_dec(act, r, w)

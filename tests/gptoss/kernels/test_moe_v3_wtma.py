"""The v3 MoE GEMMs with their weight and scale words loaded by TMA (GPTOSS_MOE_V3_WTMA, default
auto: tiles of BM <= 128; moe_v3.weight_descriptors): the same words reach the same dequant and dot
in the same K order, so act and y are the pointer path's bit for bit, under Triton's interpreter
(CI) and compiled on a GPU. The shapes include a K tail (chunks past K arrive as TMA's zero fill,
not masked loads), a last program whose rows run past the expert's (the next expert's words, or
zeros past the last expert: computed, never stored) and the in-kernel routing of a decode step."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated by triton.jit
pytest.importorskip("triton")

from gptoss.kernels import moe, moe_v3, moe_v3_dec, moe_v3_dec_gu  # noqa: E402
from gptoss.kernels.moe import Tiles  # noqa: E402
from gptoss.kernels.moe_routing import Routing, route_and_group  # noqa: E402
from gptoss.kernels.moe_tiles import DecTiles  # noqa: E402
from tests.gptoss.kernels.moekit import ALPHA, DEV, LIMIT, gpu, make_moe, poisoned_buffers  # noqa: E402, F401


def _both(monkeypatch, x, r, w, gu: Tiles, dn: Tiles) -> tuple[tuple, tuple]:
    """(act, y) by cp.async pointers, then by TMA."""
    out = []
    for mode in ("0", "1"):
        monkeypatch.setattr(moe_v3, "TMA_W", mode)
        act = moe.gate_up_v3(x, r, w, ALPHA, LIMIT, gu)
        out.append((act, moe.down_v3(act, r, w, dn)))
    return out[0], out[1]


@pytest.mark.usefixtures("poisoned_buffers")
@pytest.mark.parametrize(
    ("e", "h", "i", "tokens", "gu", "dn"),
    [
        # several tiles an expert; down's BN 128 over H 192: the last program's rows run past H
        (4, 192, 128, 40, Tiles(16, 64, 64, 4, 2), Tiles(16, 128, 64, 4, 2)),
        # K 192 (gate_up) and 192 (down) at BK 128: a step's second chunk is TMA's zero fill
        (4, 192, 192, 40, Tiles(32, 64, 128, 4, 2, half=True), Tiles(32, 64, 128, 4, 2, half=True)),
        # ~3 rows an expert, some experts none, the last expert's last rows past the tensor's end
        (8, 64, 128, 6, Tiles(16, 64, 64, 4, 2, half=True), Tiles(16, 128, 64, 4, 2)),
    ],
)
def test_weights_by_tma_give_the_pointer_paths_bits(monkeypatch, e, h, i, tokens, gu, dn):
    ref, w = make_moe(e, h, i, 4, torch.float32, seed=7, kernels="v3")
    x = torch.randn(tokens, h, device=DEV, generator=torch.Generator(DEV).manual_seed(2))
    r = route_and_group(F.linear(x, ref.router_weight, ref.router_bias), 4)
    (act, y), (act_t, y_t) = _both(monkeypatch, x, r, w, gu, dn)
    assert torch.isfinite(y).all()
    assert torch.equal(act_t, act)
    assert torch.equal(y_t, y)


def test_the_decode_steps_in_kernel_routing_with_weights_by_tma(monkeypatch):
    """T 1 with the logits routed inside gate_up (the engine's decode step): same routing buffers,
    same act."""
    ref, w = make_moe(8, 128, 128, 4, torch.float32, seed=4, kernels="v3")
    x = torch.randn(1, 128, device=DEV, generator=torch.Generator(DEV).manual_seed(5))
    logits = F.linear(x, ref.router_weight, ref.router_bias).contiguous()
    tiles = Tiles(16, 64, 64, 4, 2)
    got = []
    for mode in ("0", "1"):
        monkeypatch.setattr(moe_v3, "TMA_W", mode)
        r = Routing.empty(1, 4, 8, DEV)
        act = moe.gate_up_v3(x, r, w, ALPHA, LIMIT, tiles, logits=logits)
        got.append((act, r.ids.clone(), r.counts.clone()))
    assert torch.equal(got[1][1], got[0][1]) and torch.equal(got[1][2], got[0][2])
    assert torch.equal(got[1][0], got[0][0])


def _dec_both(monkeypatch, e, h, i, tokens, tiles, dtype=torch.float32):
    ref, w = make_moe(e, h, i, 4, dtype, seed=9, kernels="v3")
    x = torch.randn(tokens, h, device=DEV, generator=torch.Generator(DEV).manual_seed(3)).to(dtype)
    r = route_and_group(F.linear(x, ref.router_weight, ref.router_bias), 4)
    act = torch.randn(tokens * 4, i, device=DEV, generator=torch.Generator(DEV).manual_seed(4)).to(dtype)
    out = []
    for on in (False, True):
        monkeypatch.setattr(moe_v3_dec, "WTMA", on)
        out.append(moe_v3_dec.down_v3_dec(act, r, w, tiles))
    return out


@pytest.mark.usefixtures("poisoned_buffers")
@pytest.mark.parametrize(
    ("h", "i", "tiles"),
    [
        (96, 2880, DecTiles(16, 64, 512, 4, 4, 3)),  # I 45 chunks: the last step's 3 are zero fill; BN past H
        (128, 256, DecTiles(16, 32, 256, 2, 2, 2)),  # 2 warps of 2 chunks: the chunk-to-warp order
        (64, 192, DecTiles(2, 16, 128, 1, 4, 2)),  # no split; 3 chunks: the second step's 2nd is fill
    ],
)
def test_the_split_k_down_with_weights_by_tma_gives_the_same_bits(monkeypatch, h, i, tiles):
    """GPTOSS_V3_DEC_WTMA=1: moe_v3_dec's split-K down (batch 1's) reads a step's chunks in one copy
    and hands warp s chunks s*KCS.. as the pointers did: the same bits, float32 so any misplaced
    chunk shows."""
    base, tma = _dec_both(monkeypatch, 4, h, i, 5, tiles)
    assert torch.isfinite(base).all()
    assert torch.equal(tma, base)


def _gu_dec_both(monkeypatch, e, h, i, tokens, tiles, route=False, dtype=torch.float32):
    """moe_v3_dec_gu's split-K gate_up by pointers, then by TMA (its WTMA): (act, routing
    ids) each; route: the kernel routes the logits itself into empty buffers (the engine's T 1)."""
    ref, w = make_moe(e, h, i, 4, dtype, seed=11, kernels="v3")
    x = torch.randn(tokens, h, device=DEV, generator=torch.Generator(DEV).manual_seed(6)).to(dtype)
    logits = F.linear(x, ref.router_weight, ref.router_bias).contiguous()
    out = []
    for on in (False, True):
        monkeypatch.setattr(moe_v3_dec_gu, "WTMA", on)
        r = Routing.empty(tokens, 4, e, DEV) if route else route_and_group(logits, 4)
        act = moe_v3_dec_gu.gate_up_v3_dec(x, r, w, ALPHA, LIMIT, tiles, logits=logits if route else None)
        out.append((act, r.ids.clone()))
    return out


@pytest.mark.usefixtures("poisoned_buffers")
@pytest.mark.parametrize(
    ("e", "h", "i", "tokens", "tiles", "route"),
    [
        # the default tiles (BK 256, 2 warps of 2 chunks); H 2880 = 45 chunks: the last step's
        # last 3 chunks are zero fill; routing in the kernel at T 1, as the engine's decode step
        (4, 2880, 96, 1, None, True),
        # the tiles before v36 (BK 128, one chunk a warp): the last step's 2nd chunk is zero fill
        (4, 2880, 96, 1, DecTiles(16, 32, 128, 2, 2, 4), True),
        # "v3-dd-gu-w-k512w2" (BK 512, 2 warps of 4 chunks): the last step's last 3 chunks are zero fill
        (4, 2880, 96, 1, DecTiles(16, 32, 512, 2, 2, 3), True),
        (
            4,
            256,
            64,
            5,
            DecTiles(16, 32, 256, 2, 2, 2),
            False,
        ),  # 2 warps of 2 chunks: the chunk-to-warp order
        # 2I = 192 rows at BN 128: each expert's second block runs 64 rows into the next expert's
        # words (zeros past the last expert's); computed, never stored
        (4, 192, 96, 3, DecTiles(4, 128, 128, 2, 2, 3), False),
    ],
)
def test_the_split_k_gate_up_with_weights_by_tma_gives_the_same_bits(
    monkeypatch, e, h, i, tokens, tiles, route
):
    """GPTOSS_V3_DEC_GATE_UP_WTMA: the split-K gate_up's words by TMA, a step's chunks in
    one copy, warp s given chunks s*KCS.. as the pointers give them: the same act bit for bit in
    float32, where any misplaced chunk or row shows, and the same routing."""
    (act, ids), (act_t, ids_t) = _gu_dec_both(monkeypatch, e, h, i, tokens, tiles, route)
    assert torch.isfinite(act).all() and act.abs().sum() > 0
    assert torch.equal(ids_t, ids)
    assert torch.equal(act_t, act)


def test_descriptors_refuse_what_the_copies_cannot_tile():
    _, w = make_moe(4, 128, 128, 4, torch.float32, seed=1, kernels="v3")
    d = moe_v3.weight_descriptors(w.w13, w.s13, 128, 128)
    assert d["WTMA"] is True
    assert list(d["w_desc"].shape) == [4 * 256 // 16, 2, 128]
    assert list(d["w_desc"].block_shape) == [8, 2, 128]
    assert list(d["s_desc"].shape) == [4 * 256 // 16, 2, 8]
    with pytest.raises(
        ValueError, match="rows % 16 == 0 and BK % 64 == 0, got words \\(4, 256, 64\\), rows 24"
    ):
        moe_v3.weight_descriptors(w.w13, w.s13, 24, 128)


def test_the_switch_reads_0_1_or_auto():
    assert [moe_v3._wtma_switch(v) for v in ("0", "1", "auto")] == ["0", "1", "auto"]
    with pytest.raises(ValueError, match="GPTOSS_MOE_V3_WTMA='yes': 0, 1 or auto"):
        moe_v3._wtma_switch("yes")


@pytest.mark.parametrize(
    ("mode", "bm", "takes"),
    [("auto", 128, True), ("auto", 256, False), ("1", 256, True), ("0", 16, False)],
)
def test_which_tiles_take_the_weights_by_tma(monkeypatch, mode, bm, takes):
    """auto (the default): the decode and few-rows tiles (timed faster), not the BM-256 ones (untimed)."""
    _, w = make_moe(4, 128, 128, 4, torch.float32, seed=1, kernels="v3")
    x = torch.zeros(2, 128, device=DEV)
    monkeypatch.setattr(moe_v3, "TMA_W", mode)
    args = moe_v3._wtma_args(x, w.w13, w.s13, True, 128, Tiles(bm, 64, 64, 4, 2, half=bm > 16))
    assert (args.get("WTMA") is True) is takes
    assert moe_v3._wtma_args(x, w.w13, w.s13, False, 128, Tiles(bm, 64, 64, 4, 2)) == {}  # "v3ds": never


@gpu
@pytest.mark.parametrize(
    ("e", "tokens", "gu", "dn"),
    [
        (128, 1, Tiles(16, 64, 128, 4, 4), Tiles(16, 64, 128, 4, 4)),  # 120b's decode tiles
        (128, 256, Tiles(32, 64, 128, 4, 3), Tiles(32, 64, 128, 4, 3)),  # ~8 rows an expert
        # BK 128: the pointer path of half tiles of BM 64 at BK 64 races (moe_v3.racy_pointer_down)
        (128, 1024, Tiles(64, 64, 128, 4, 3, half=True), Tiles(64, 128, 128, 4, 4, half=True)),
        # 120b's few-rows defaults since v46 (3 stages, 168 registers)
        (
            128,
            1024,
            Tiles(64, 64, 128, 4, 3, half=True, maxnreg=168),
            Tiles(64, 128, 128, 4, 3, half=True, maxnreg=168),
        ),
        (
            32,
            1024,
            Tiles(256, 64, 64, 8, 4, half=True),
            Tiles(256, 128, 64, 8, 4, half=True),
        ),  # 20b bucket 128
    ],
)
def test_weights_by_tma_give_the_pointer_paths_bits_on_gpu(monkeypatch, e, tokens, gu, dn):
    """Full 2880 shapes, bf16, compiled: wgmma sums over K in the same order whichever way the words
    reached the registers."""
    ref, w = make_moe(e, 2880, 2880, 4, torch.bfloat16, seed=3, kernels="v3")
    x = torch.randn(tokens, 2880, device=DEV, generator=torch.Generator(DEV).manual_seed(0)).bfloat16()
    r = route_and_group(F.linear(x, ref.router_weight, ref.router_bias), 4)
    (act, y), (act_t, y_t) = _both(monkeypatch, x, r, w, gu, dn)
    assert torch.equal(act_t, act)
    assert torch.equal(y_t, y)


@gpu
def test_the_split_k_down_with_weights_by_tma_gives_the_same_bits_on_gpu(monkeypatch):
    """120b's batch-1 down (one token, 4 experts, the default tiles), bf16, compiled."""
    base, tma = _dec_both(monkeypatch, 128, 2880, 2880, 1, None, torch.bfloat16)
    assert torch.equal(tma, base)


@pytest.mark.parametrize(
    ("tiles", "racy"),
    [
        (Tiles(64, 128, 64, 8, 3, half=True), True),
        (Tiles(128, 128, 64, 8, 3, half=True), True),
        (Tiles(64, 128, 64, 4, 3, half=True), True),
        (Tiles(32, 128, 64, 4, 3, half=True), False),
        (Tiles(256, 128, 64, 8, 3, half=True), False),
        (Tiles(64, 128, 64, 4, 3), False),
        (Tiles(64, 128, 128, 4, 4, half=True), False),
    ],
)
def test_which_down_tiles_race_on_the_pointer_path(tiles, racy):
    """The tiles measured racy on the GPU (bench/kernels/moe_repeat_gpu.py, v30) and their neighbours
    measured deterministic; the one racy default down tile (bucket 64's, since v44) has a safe one for
    the cp.async path, and no other default is racy."""
    from gptoss.kernels.moe_tiles import _DOWN_TILES_V3, _POINTER_DOWN_V3

    assert moe_v3.racy_pointer_down(tiles) is racy
    racy_buckets = [b for b, t in _DOWN_TILES_V3.items() if moe_v3.racy_pointer_down(t)]
    assert racy_buckets == [64] == list(_POINTER_DOWN_V3)
    assert not moe_v3.racy_pointer_down(_POINTER_DOWN_V3[64])


@gpu
def test_the_racy_pointer_down_is_refused_and_runs_by_tma(monkeypatch):
    ref, w = make_moe(8, 256, 256, 4, torch.bfloat16, seed=3, kernels="v3")
    x = torch.randn(64, 256, device=DEV, generator=torch.Generator(DEV).manual_seed(0)).bfloat16()
    r = route_and_group(F.linear(x, ref.router_weight, ref.router_bias), 4)
    act = torch.randn(256, 256, device=DEV, generator=torch.Generator(DEV).manual_seed(1)).bfloat16()
    racy = Tiles(64, 128, 64, 8, 3, half=True)
    monkeypatch.setattr(moe_v3, "TMA_W", "0")
    with pytest.raises(moe_v3.RacyTilesError, match=r"cp.async path gives other values from run to run"):
        moe.down_v3(act, r, w, racy)
    monkeypatch.setattr(moe_v3, "TMA_W", "auto")
    runs = [moe.down_v3(act, r, w, racy) for _ in range(5)]
    assert all(torch.equal(runs[0], y) for y in runs[1:])


@pytest.mark.parametrize(("tma_w", "pointer"), [("auto", False), ("1", False), ("0", True)])
def test_pointer_down_follows_the_weight_switch(monkeypatch, tma_w, pointer):
    """moe_v3.pointer_down: v3 words by cp.async where TMA_W is "0" (or TMA does not run): the engine's
    down then takes choose_tiles_v3's cp.async-safe tiles; v3ds never loads by TMA but never races."""
    _, w = make_moe(8, 64, 64, 4, torch.bfloat16, seed=1, kernels="v3")
    monkeypatch.setattr(moe_v3, "TMA_W", tma_w)
    act = torch.zeros(4, 64, device=DEV, dtype=torch.bfloat16)
    assert moe_v3.pointer_down(act, w) is pointer
    _, w3ds = make_moe(8, 64, 64, 4, torch.bfloat16, seed=1, kernels="v3ds")
    assert moe_v3.pointer_down(act, w3ds) is False


@gpu
def test_bucket_64_on_the_pointer_path_takes_safe_tiles_on_gpu(monkeypatch):
    """20b at M 512 (64 rows an expert) with GPTOSS_MOE_V3_WTMA=0: the table's BK-64 down would race on
    cp.async and down_v3 would refuse it; the engine's path takes the safe tiles and gives the bits
    the TMA path gives."""
    ref, w = make_moe(32, 2880, 2880, 4, torch.bfloat16, seed=5, kernels="v3")
    x = torch.randn(512, 2880, device=DEV, generator=torch.Generator(DEV).manual_seed(1)).bfloat16()
    r = route_and_group(F.linear(x, ref.router_weight, ref.router_bias), 4)
    by_tma = moe.expert_rows_v3(x, r, w, ALPHA, LIMIT)
    monkeypatch.setattr(moe_v3, "TMA_W", "0")
    assert torch.equal(moe.expert_rows_v3(x, r, w, ALPHA, LIMIT), by_tma)

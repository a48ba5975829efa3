"""The flat decode GEMMs (gptoss.kernels.moe_decode_flat) against the expert-slot kernels: the same
items, summed by the same K steps and dots, so the same bits, whichever program takes which item.

Without CUDA the kernels run in Triton's interpreter. The tests set the "SMs" the grid is sized by
(moe_decode._sms): small grids make one program cross experts and column blocks; a grid past the
items gives one item a program. Every output buffer starts as NaN (moekit's poisoned_buffers),
so a row or column that no program writes fails.
"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated by triton.jit
pytest.importorskip("triton")

from gptoss.kernels import moe, moe_decode, moe_decode_flat, moe_tiles  # noqa: E402
from gptoss.kernels.moe_routing import Routing, route_and_group  # noqa: E402
from gptoss.kernels.moe_tiles import DecTiles  # noqa: E402
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

GU = DecTiles(8, 16, 256, 2, 2, 2)
DN = DecTiles(8, 32, 128, 1, 2, 3)


def _flat(t: DecTiles, per_sm: int = 2) -> DecTiles:
    return replace(t, per_sm=per_sm)


def _launches(monkeypatch) -> list[tuple[str, tuple]]:
    """Records which kernel each decode GEMM launched, on which grid."""
    seen = []
    real = moe_decode._kernel_grid

    def spy(*a):
        kernel, grid, own = real(*a)
        seen.append((kernel.fn.__name__ if hasattr(kernel, "fn") else kernel.__name__, grid))
        return kernel, grid, own

    monkeypatch.setattr(moe_decode, "_kernel_grid", spy)
    return seen


def _both(x, r, w, lora13=None, lora2=None, per_sm=2, gu=GU, dn=DN):
    """(act, y) from the slot kernels and from the flat ones."""
    out = []
    for flat in (False, True):
        g, d = (_flat(gu, per_sm), _flat(dn, per_sm)) if flat else (gu, dn)
        act = moe_decode.gate_up_dec(x, r, w, ALPHA, LIMIT, g, lora=lora13)
        out.append((act, moe_decode.down_dec(act, r, w, d, lora=lora2)))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens, sms", [(1, 1), (1, 3), (2, 3), (5, 2), (12, 3), (16, 1), (3, 1000)])
def test_flat_equals_the_slot_kernels_bit_for_bit(dtype, tokens, sms, monkeypatch):
    """E 8, H 160 (a masked K tail for gate_up's BK 256), I 96: 6 gate_up blocks of 16 and 5 down
    blocks of 32 an expert; 12 and 16 tokens give experts past BM 8 rows (the row loop)."""
    monkeypatch.setattr(moe_decode, "_sms", lambda x: sms)
    ref, w = make_moe(8, 160, 96, 4, dtype, seed=50 + tokens)
    x = (torch.randn(tokens, 160, generator=torch.Generator(DEV).manual_seed(tokens), device=DEV) * 3).to(
        dtype
    )
    r = route_and_group(F.linear(x, ref.router_weight, ref.router_bias), 4)
    seen = _launches(monkeypatch)
    (act_s, y_s), (act_f, y_f) = _both(x, r, w)
    slots = min(8, tokens * 4)
    assert [s[0] for s in seen] == [
        "_gate_up_dec_kernel",
        "_down_dec_kernel",
        "_gate_up_flat_kernel",
        "_down_flat_kernel",
    ]
    assert seen[2][1] == (min(6 * slots, 2 * sms),) and seen[3][1] == (min(5 * slots, 2 * sms),)
    assert not act_f.isnan().any() and not y_f.isnan().any()
    assert torch.equal(act_f, act_s) and torch.equal(y_f, y_s)
    out = moe.combine(y_f, r.weights, x.dtype)
    assert ((out.double() - reference(ref, x).double()).norm() / reference(ref, x).double().norm()) <= TOL[
        dtype
    ]


def test_an_expert_with_every_token_and_idle_experts(monkeypatch):
    """Expert 0 takes all 16 tokens (two BM-8 chunks), expert 7 none: a program's range skips nothing
    and writes no row twice; 3 programs for 4 active experts x 6 blocks."""
    monkeypatch.setattr(moe_decode, "_sms", lambda x: 3)
    ref, w = make_moe(8, 160, 96, 4, torch.float32, seed=4)
    ref.router_weight.mul_(1e-3)
    ref.router_bias.copy_(torch.tensor([100.0, 50.0, 40.0, 30.0, 0.0, 0.0, 0.0, -100.0]))
    x = torch.randn(16, 160, generator=torch.Generator(DEV).manual_seed(4), device=DEV)
    r = route_and_group(F.linear(x, ref.router_weight, ref.router_bias), 4)
    assert r.counts.tolist() == [16, 16, 16, 16, 0, 0, 0, 0]
    (act_s, y_s), (act_f, y_f) = _both(x, r, w, per_sm=1)
    assert torch.equal(act_f, act_s) and torch.equal(y_f, y_s)


def test_routing_inside_the_flat_gate_up(monkeypatch):
    """experts_dec_logits on flat tiles: program 0 stores the routing, every program routes alike."""
    monkeypatch.setattr(moe_decode, "_sms", lambda x: 3)
    monkeypatch.setattr(moe_tiles, "DEC_TILE_OVERRIDE", {True: GU, False: DN})
    ref, w = make_moe(8, 160, 96, 4, torch.bfloat16, seed=8)
    x = (torch.randn(5, 160, generator=torch.Generator(DEV).manual_seed(8), device=DEV) * 3).bfloat16()
    logits = F.linear(x, ref.router_weight, ref.router_bias).float()
    want_y, want_r = moe_decode.experts_dec_logits(x, logits, 4, w, ALPHA, LIMIT)
    monkeypatch.setattr(moe_tiles, "DEC_TILE_OVERRIDE", {True: _flat(GU, 1), False: _flat(DN, 1)})
    seen = _launches(monkeypatch)
    y, r = moe_decode.experts_dec_logits(x, logits, 4, w, ALPHA, LIMIT)
    assert [s[0] for s in seen] == ["_gate_up_flat_kernel", "_down_flat_kernel"]
    assert torch.equal(r.ids, want_r.ids) and torch.equal(r.counts, want_r.counts)
    assert torch.equal(y, want_y)


@pytest.mark.parametrize("tokens", [1, 6])
def test_flat_with_the_lora_expand(tokens, monkeypatch):
    """Both GEMMs' epilogues add B_e @ s^T per item, as the slot kernels do."""
    monkeypatch.setattr(moe_decode, "_sms", lambda x: 2)
    ref, w = make_moe(8, 160, 96, 4, torch.float32, seed=30 + tokens)
    g = torch.Generator(DEV).manual_seed(tokens)
    x = torch.randn(tokens, 160, generator=g, device=DEV) * 3
    r = route_and_group(F.linear(x, ref.router_weight, ref.router_bias), 4)
    lw = 16
    lora13 = (
        torch.randn(8, 2, 96, lw, generator=g, device=DEV),
        torch.randn(tokens * 4, lw, generator=g, device=DEV),
    )
    lora2 = (
        torch.randn(8, 160, lw, generator=g, device=DEV),
        torch.randn(tokens * 4, lw, generator=g, device=DEV),
    )
    (act_s, y_s), (act_f, y_f) = _both(x, r, w, lora13, lora2)
    assert torch.equal(act_f, act_s) and torch.equal(y_f, y_s)
    (act_0, _), _ = _both(x, r, w)
    assert (act_f - act_0).abs().max() > 0.1  # the expand was added


def test_columns_not_a_multiple_of_bn_take_the_slot_kernels(monkeypatch):
    ref, w = make_moe(8, 64, 96, 4, torch.float32, seed=3)
    x = torch.randn(2, 64, device=DEV)
    r = route_and_group(F.linear(x, ref.router_weight, ref.router_bias), 4)
    seen = _launches(monkeypatch)
    act = moe_decode.gate_up_dec(x, r, w, ALPHA, LIMIT, _flat(replace(GU, bn=64)))  # I 96 % 64 != 0
    assert seen[0][0] == "_gate_up_dec_kernel" and seen[0][1] == (2, 8)
    assert torch.equal(act, moe_decode.gate_up_dec(x, r, w, ALPHA, LIMIT, replace(GU, bn=64)))


def test_grid_size():
    assert moe_decode_flat.programs(720, 132, 2) == 264
    assert moe_decode_flat.programs(100, 132, 2) == 100
    assert moe_decode_flat.programs(0, 132, 2) == 1


def test_which_batches_take_the_flat_kernels(monkeypatch):
    """The measured default: the flat kernels from BM 8 (T >= 5), the slot kernels below;
    GPTOSS_MOE_FLAT (FLAT_FORCED) sets P at every T; a tile override keeps its own."""
    monkeypatch.setattr(moe_tiles, "FLAT_FORCED", None)
    assert [moe_tiles.dec_tiles(True, 2880, t).per_sm for t in (1, 2, 4, 5, 16)] == [0, 0, 0, 4, 4]
    assert [moe_tiles.dec_tiles(False, 2880, t).per_sm for t in (4, 8)] == [0, 4]
    monkeypatch.setattr(moe_tiles, "FLAT_FORCED", 2)
    assert [moe_tiles.dec_tiles(True, 2880, t).per_sm for t in (1, 16)] == [2, 2]
    monkeypatch.setattr(moe_tiles, "FLAT_FORCED", 0)
    assert moe_tiles.dec_tiles(True, 2880, 16).per_sm == 0
    monkeypatch.setattr(moe_tiles, "DEC_TILE_OVERRIDE", {True: GU})
    monkeypatch.setattr(moe_tiles, "FLAT_FORCED", 2)
    assert moe_tiles.dec_tiles(True, 2880, 16).per_sm == 0


def test_an_empty_routing_writes_nothing(monkeypatch):
    """No active expert (counts all zero): every program's range is empty."""
    _, w = make_moe(8, 160, 96, 4, torch.float32, seed=1)
    x = torch.randn(2, 160, device=DEV)
    r = Routing.empty(2, 4, 8, DEV)
    r.counts.zero_()
    act = moe_decode.gate_up_dec(x, r, w, ALPHA, LIMIT, _flat(GU))
    assert act.isnan().all()


@pytest.mark.skipif(DEV.type != "cuda", reason="needs CUDA (compiled kernels)")
@pytest.mark.parametrize("per_sm", [1, 2, 4])
@pytest.mark.parametrize("tokens", [1, 2, 4, 8, 16])
def test_20b_shapes_on_gpu(tokens, per_sm):
    """Compiled at 20b's shapes with the default tiles: bit-equal to the slot kernels."""
    ref, w = make_moe(32, 2880, 2880, 4, torch.bfloat16, seed=tokens)
    x = torch.randn(tokens, 2880, device=DEV).bfloat16()
    r = route_and_group(F.linear(x, ref.router_weight, ref.router_bias), 4)
    gu = moe_tiles.dec_tiles(True, 2880, tokens)
    dn = moe_tiles.dec_tiles(False, 2880, tokens)
    (act_s, y_s), (act_f, y_f) = _both(
        x, r, w, per_sm=per_sm, gu=replace(gu, per_sm=0), dn=replace(dn, per_sm=0)
    )
    assert torch.equal(act_f, act_s) and torch.equal(y_f, y_s)


def test_a_bad_flat_switch_is_refused_by_name():
    assert moe_tiles._flat_forced(None) is None and moe_tiles._flat_forced("") is None
    assert moe_tiles._flat_forced("0") == 0 and moe_tiles._flat_forced("4") == 4
    with pytest.raises(ValueError, match=r"GPTOSS_MOE_FLAT must be a count of programs an SM .* got 'yes'"):
        moe_tiles._flat_forced("yes")

"""The v3 MoE's tile rows (moe_common._tile_rows, moe_routing.slot_rows): a tile's slots past its
expert's rows name assignment 0, a real row. With moe_common.UNMASKED_ROWS, moe_v3_kernels._v3_gemm and
the split-K down (moe_v3_dec) load x / act rows without a row mask on that promise (an unmasked
cp.async a row: fewer instructions a K step), so a slot past the rows that named anything else would
read out of bounds. Masked (the default until a GPU has timed it) or not, the bits are the same, as
only columns of valid rows are stored. Without CUDA the kernels run in Triton's interpreter."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated by triton.jit
triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from gptoss.kernels import moe, moe_common, moe_v3, moe_v3_dec  # noqa: E402
from gptoss.kernels.moe_common import _tile_rows  # noqa: E402
from gptoss.kernels.moe_routing import route_and_group, slot_rows  # noqa: E402
from gptoss.kernels.moe_tiles import DecTiles, Tiles  # noqa: E402
from tests.gptoss.kernels.moekit import (  # noqa: E402, F401 - the fixtures apply here too
    ALPHA,
    DEV,
    LIMIT,
    gpu,
    interpreter_like_the_gpu,
    make_moe,
    poisoned_buffers,
    pytestmark,
)


@triton.jit
def _rows_kernel(rows_ptr, out_ptr, valid_ptr, T, e, slot0, n_rows, BM: tl.constexpr):
    rows, valid = _tile_rows(rows_ptr, T, e, slot0, n_rows, BM)
    tl.store(out_ptr + tl.arange(0, BM), rows)
    tl.store(valid_ptr + tl.arange(0, BM), valid.to(tl.int32))


@triton.jit
def _routed_rows_kernel(flat_ptr, a_ptr, pos_ptr, out_ptr, e, n_rows, A: tl.constexpr, BM: tl.constexpr):
    i = tl.arange(0, A)
    slot = tl.arange(0, BM)
    rows = slot_rows(
        tl.load(flat_ptr + i), tl.load(a_ptr + i), tl.load(pos_ptr + i), None, e, slot, slot < n_rows, 0, True
    )
    tl.store(out_ptr + slot, rows)


@pytest.mark.parametrize("slot0, n_rows", [(0, 3), (16, 21), (0, 0)])
def test_slots_past_the_experts_rows_name_assignment_zero(slot0, n_rows):
    """Expert 2's list in a [E, T] table whose other entries are all T (out of range): the tile's
    slots past n_rows come back 0, never a neighbour's entry."""
    e, t, bm = 2, 40, 16
    table = torch.full((4, t), t, dtype=torch.int32, device=DEV)
    table[e] = torch.arange(100, 100 + t, dtype=torch.int32)
    out = torch.full((bm,), -1, dtype=torch.int32, device=DEV)
    valid = torch.full((bm,), -1, dtype=torch.int32, device=DEV)
    _rows_kernel[(1,)](table, out, valid, t, e, slot0, n_rows, BM=bm)
    live = max(0, min(bm, n_rows - slot0))
    assert out[:live].tolist() == list(range(100 + slot0, 100 + slot0 + live))
    assert out[live:].tolist() == [0] * (bm - live)
    assert valid.tolist() == [1] * live + [0] * (bm - live)


def test_routed_slots_past_the_experts_rows_name_assignment_zero():
    """The routing in registers (ROUTE): expert 3 holds assignments 5 and 9 at places 0 and 1; slots
    2-7 match no assignment and come back 0."""
    flat = torch.tensor([1, 3, 0, 3], dtype=torch.int32, device=DEV)
    a = torch.tensor([4, 5, 6, 9], dtype=torch.int32, device=DEV)
    pos = torch.tensor([0, 0, 0, 1], dtype=torch.int32, device=DEV)
    out = torch.full((8,), -1, dtype=torch.int32, device=DEV)
    _routed_rows_kernel[(1,)](flat, a, pos, out, 3, 2, A=4, BM=8)
    assert out.tolist() == [5, 9, 0, 0, 0, 0, 0, 0]


class _LaunchSpy:
    """Stands in for a JIT kernel: each launch records the UNMASKED it was given (False when none)."""

    def __init__(self, kernel, seen: list[bool]):
        self.kernel, self.seen = kernel, seen

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def run(*a, **kw):
            self.seen.append(kw.get("UNMASKED", False))
            return launch(*a, **kw)

        return run


def _both_ways(monkeypatch, run, owner, name: str):
    """run() with the rows masked (the default), then with moe_common.UNMASKED_ROWS, which it turns off
    again; owner.name's launches must have been told so."""
    seen: list[bool] = []
    monkeypatch.setattr(owner, name, _LaunchSpy(getattr(owner, name), seen))
    assert moe_common.UNMASKED_ROWS is False
    masked = run()
    monkeypatch.setattr(moe_common, "UNMASKED_ROWS", True)
    unmasked = run()
    monkeypatch.setattr(moe_common, "UNMASKED_ROWS", False)
    assert seen == [False, True]
    return masked, unmasked


@pytest.mark.parametrize(
    ("h", "tiles"),
    [
        (160, Tiles(32, 64, 64, 4, 2, half=True)),  # K 160: a masked K tail; short tiles on the half body
        (128, Tiles(16, 64, 64, 4, 2)),  # K 128 = 2 x BK: no mask at all
    ],
)
def test_gate_up_and_down_give_the_same_bits_with_and_without_row_masks(monkeypatch, h, tiles):
    """12 tokens over 8 experts: every expert's last tile is partial, so slots past its rows load
    assignment 0's row unmasked; the stored rows are the same bits either way."""
    ref, w = make_moe(8, h, 96, 4, torch.bfloat16, seed=11, kernels="v3")
    x = (torch.randn(12, h, generator=torch.Generator().manual_seed(2)) * 3).to(DEV).bfloat16()
    r = route_and_group(F.linear(x, ref.router_weight, ref.router_bias), 4)
    assert any(c % tiles.bm for c in r.counts.tolist())  # a partial tile exists
    act, act_unmasked = _both_ways(
        monkeypatch, lambda: moe.gate_up_v3(x, r, w, ALPHA, LIMIT, tiles), moe_v3, "_gate_up_v3_kernel"
    )
    assert torch.equal(act, act_unmasked) and not act.isnan().any()
    y, y_unmasked = _both_ways(monkeypatch, lambda: moe.down_v3(act, r, w, tiles), moe_v3, "_down_v3_kernel")
    assert torch.equal(y, y_unmasked) and not y.isnan().any()


@pytest.mark.parametrize("tokens", [1, 5])
def test_the_split_k_down_gives_the_same_bits_with_and_without_row_masks(monkeypatch, tokens):
    """The split-K down at BM 8: 5 tokens leave most experts' 8-row tile partial; one token takes the
    ONE_TOKEN path, whose slot rows past the first are assignment 0 too."""
    ref, w = make_moe(8, 128, 128, 4, torch.bfloat16, seed=5, kernels="v3")
    x = (torch.randn(tokens, 128, generator=torch.Generator().manual_seed(1)) * 3).to(DEV).bfloat16()
    r = route_and_group(F.linear(x, ref.router_weight, ref.router_bias), 4)
    act = (torch.randn(tokens * 4, 128, generator=torch.Generator().manual_seed(4))).to(DEV).bfloat16()
    t = DecTiles(8, 32, 128, 2, 2, 2)
    y, y_unmasked = _both_ways(
        monkeypatch, lambda: moe_v3_dec.down_v3_dec(act, r, w, t), moe_v3_dec, "_down_v3_dec_kernel"
    )
    assert torch.equal(y, y_unmasked) and not y.isnan().any()


@gpu
@pytest.mark.parametrize(
    ("tokens", "gu", "dn"),
    [
        (1024, Tiles(256, 64, 64, 8, 4, half=True), Tiles(256, 128, 64, 8, 4, half=True)),  # bucket 128
        (4096, Tiles(256, 64, 64, 8, 3, half=True), Tiles(256, 128, 64, 8, 3, half=True)),  # bucket 512
        (300, Tiles(128, 128, 64, 8, 6, half=True), Tiles(128, 256, 64, 8, 6, half=True)),  # bucket 64
    ],
)
def test_row_masks_change_no_bits_compiled_at_20b_shapes_on_gpu(monkeypatch, tokens, gu, dn):
    """Compiled at the engine's large-batch tiles: the unmasked K loops (fewer instructions) store the
    masked ones' bits. v20's int32 row offsets were faster and compiled wrong; this is the check that
    caught it, for this change."""
    ref, w = make_moe(32, 2880, 2880, 4, torch.bfloat16, seed=3, kernels="v3")
    x = torch.randn(tokens, 2880, device=DEV, generator=torch.Generator(DEV).manual_seed(0)).bfloat16()
    r = route_and_group(F.linear(x, ref.router_weight, ref.router_bias), 4)
    act, act_unmasked = _both_ways(
        monkeypatch, lambda: moe.gate_up_v3(x, r, w, ALPHA, LIMIT, gu), moe_v3, "_gate_up_v3_kernel"
    )
    assert torch.equal(act, act_unmasked)
    y, y_unmasked = _both_ways(monkeypatch, lambda: moe.down_v3(act, r, w, dn), moe_v3, "_down_v3_kernel")
    assert torch.equal(y, y_unmasked)


@gpu
@pytest.mark.parametrize("tokens", [1, 8, 16])
def test_split_k_down_row_masks_change_no_bits_compiled_on_gpu(monkeypatch, tokens):
    ref, w = make_moe(32, 2880, 2880, 4, torch.bfloat16, seed=3, kernels="v3")
    x = torch.randn(tokens, 2880, device=DEV, generator=torch.Generator(DEV).manual_seed(0)).bfloat16()
    r = route_and_group(F.linear(x, ref.router_weight, ref.router_bias), 4)
    act = torch.randn(tokens * 4, 2880, device=DEV, generator=torch.Generator(DEV).manual_seed(1)).bfloat16()
    y, y_unmasked = _both_ways(
        monkeypatch, lambda: moe_v3_dec.down_v3_dec(act, r, w), moe_v3_dec, "_down_v3_dec_kernel"
    )
    assert torch.equal(y, y_unmasked)


@pytest.mark.parametrize(
    ("value", "out"),
    [("1", "True {'UNMASKED': True}"), ("0", "False {}"), ("yes", "GPTOSS_MOE_UNMASKED_ROWS='yes': 0 or 1")],
)
def test_the_environment_sets_the_switch_and_refuses_other_values(value, out):
    code = "from gptoss.kernels import moe_common as c\nprint(c.UNMASKED_ROWS, c.unmasked_args())"
    env = {**os.environ, "GPTOSS_MOE_UNMASKED_ROWS": value, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert (done.returncode == 0) is (value != "yes")
    assert (
        (done.stdout if done.returncode == 0 else done.stderr.strip().splitlines()[-1]).strip().endswith(out)
    )

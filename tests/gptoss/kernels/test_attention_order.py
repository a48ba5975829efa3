"""Decode attention's launch order (GPTOSS_ATTN_HEADS_FIRST): the grid (KV head, split, sequence)
puts a sequence's KV heads side by side and gives the bits of the default (split, sequence, KV head)
grid, with the reduce launch or the in-kernel merge, on both pools; prefill keeps its order.
Interpreter on CPU, compiled with CUDA."""

from __future__ import annotations

import pytest
import torch

from tests.gptoss.kernels.test_attention_kernel import (  # conftest set TRITON_INTERPRET first
    TOL,
    assert_rows_close,
    make_step,
    reference,
    run_kernel,
)
from tests.gptoss.kernels.test_attention_splits import _LaunchRecorder, reread_settings

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")

CTX = [300, 0, 129, 17, 200]  # an empty context, ranges shorter than a tile, many tiles


@pytest.mark.parametrize("merge", [False, True], ids=["reduce", "merge"])
@pytest.mark.parametrize("pool", ["full", "ring"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_heads_first_gives_the_default_orders_bits(dtype, pool, merge, monkeypatch):
    """Three KV heads (a grid axis unlike the split and sequence counts), split at a 4096-key hint
    into splits of >= 32 keys (a full layer 36: 4 programs an SM over 15 pairs; the ring's window
    4): the partials' places, the tickets and the reduce follow the new axes."""
    from gptoss.kernels import attention

    monkeypatch.setattr(attention, "SMALL_SPLIT_KEYS", 32)  # five sequences: a small launch
    st = make_step(CTX, [1] * len(CTX), 12, 3, dtype, seed=5, fill=float("nan"))
    want = run_kernel(st, pool, max_context_hint=4096, merge_in_kernel=merge)
    monkeypatch.setattr(attention, "HEADS_FIRST", True)
    rec = _LaunchRecorder(attention._attn_kernel, keys=("HEADS_FIRST", "SPLIT", "MERGE"))
    monkeypatch.setattr(attention, "_attn_kernel", rec)
    for _ in range(2):  # twice: the tickets the first launch leaves must be zero again
        got = run_kernel(st, pool, max_context_hint=4096, merge_in_kernel=merge)
        assert not want.isnan().any() and torch.equal(got, want)
    assert_rows_close(got, reference(st, pool), TOL[dtype])
    (launch, _) = rec.launches
    splits = launch["grid"][1]
    assert (
        launch["grid"] == (3, splits, len(CTX))
        and splits == {"full": 36, "ring": 4}[pool]
        and launch["HEADS_FIRST"]
    )
    assert launch["SPLIT"] and launch["MERGE"] == merge
    if merge:
        assert not attention._tickets[got.device].any()


def test_prefill_keeps_its_order_with_heads_first(monkeypatch):
    """A step with query tokens (q tiles on axis 0) launches as before, HEADS_FIRST off."""
    from gptoss.kernels import attention

    monkeypatch.setattr(attention, "HEADS_FIRST", True)
    rec = _LaunchRecorder(attention._attn_kernel, keys=("HEADS_FIRST",))
    monkeypatch.setattr(attention, "_attn_kernel", rec)
    st = make_step([40, 0], [5, 3], 8, 2, torch.float32, seed=3, fill=float("nan"))
    got = run_kernel(st, "full")
    assert_rows_close(got, reference(st, "full"), TOL[torch.float32])
    (launch,) = rec.launches
    assert launch["grid"][1:] == (2, 2) and not launch["HEADS_FIRST"]


def test_heads_first_from_the_environment(monkeypatch):
    """Off by default; GPTOSS_ATTN_HEADS_FIRST=1 turns it on, anything but 0 / 1 is refused by name."""
    monkeypatch.delenv("GPTOSS_ATTN_HEADS_FIRST", raising=False)
    try:
        assert reread_settings().HEADS_FIRST is False
        monkeypatch.setenv("GPTOSS_ATTN_HEADS_FIRST", "1")
        assert reread_settings().HEADS_FIRST is True
        monkeypatch.setenv("GPTOSS_ATTN_HEADS_FIRST", "yes")
        with pytest.raises(ValueError, match="GPTOSS_ATTN_HEADS_FIRST='yes': expected one of 0, 1"):
            reread_settings()
    finally:
        monkeypatch.undo()
        reread_settings()

"""A GPU's own setting for full layers' large decode launches (attention.FULL_DECODE_BY_GPU: an H100
takes a 32-key tile in the heads-first order): which launches take it, what they compute, and the
environment that turns it off. The device's name is stood in for (interpreter on CPU)."""

from __future__ import annotations

import pytest
import torch

from gptoss.kernels.attention_settings import full_decode_setting
from tests.gptoss.kernels.test_attention_kernel import (  # conftest set TRITON_INTERPRET first
    TOL,
    assert_rows_close,
    make_step,
    reference,
    run_kernel,
)
from tests.gptoss.kernels.test_attention_splits import _LaunchRecorder, reread_settings

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")

H100 = "NVIDIA H100 80GB HBM3"
KEYS = ("BLOCK_N", "num_warps", "num_stages", "HEADS_FIRST")


def test_the_table_is_looked_up_by_the_name():
    table = {"H100": ((32, 2, 3), True)}
    assert full_decode_setting(H100, table) == ((32, 2, 3), True)
    assert full_decode_setting("NVIDIA H100 PCIe", table) == ((32, 2, 3), True)
    assert full_decode_setting("NVIDIA H200", table) is None
    assert full_decode_setting("", table) is None  # off CUDA (the interpreter): never
    assert full_decode_setting(H100, {}) is None


def _launch(monkeypatch, gpu: str, ctx: list[int], pool: str, dtype=torch.float32):
    """One decode step of len(ctx) sequences on `pool` with the device named `gpu`: its launch's
    settings and grid, after checking its rows against the reference."""
    from gptoss.kernels import attention

    monkeypatch.setattr(attention, "gpu_name", lambda t: gpu)
    monkeypatch.setattr(attention, "FULL_DECODE_BY_GPU", {"H100": ((32, 2, 3), True)})
    rec = _LaunchRecorder(attention._attn_kernel, keys=KEYS)
    monkeypatch.setattr(attention, "_attn_kernel", rec)
    st = make_step(ctx, [1] * len(ctx), 8, 2, dtype, seed=len(ctx), fill=float("nan"))
    got = run_kernel(st, pool, max_context_hint=4096)
    assert not got.isnan().any()
    assert_rows_close(got, reference(st, pool), TOL[dtype])
    (launch, *_) = rec.launches  # the attention launch (a reduce may follow)
    return launch


LARGE = [300, 0, 129, 17, 200, 64, 33, 1, 95, 250, 16, 128]  # 12 sequences: past SMALL_DECODE (8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_a_large_full_layer_decode_on_an_h100_takes_its_tile_heads_first(monkeypatch, dtype):
    launch = _launch(monkeypatch, H100, LARGE, "full", dtype)
    assert {k: launch[k] for k in KEYS} == {
        "BLOCK_N": 32,
        "num_warps": 2,
        "num_stages": 3,
        "HEADS_FIRST": True,
    }
    assert launch["grid"][0] == 2 and launch["grid"][2] == len(LARGE)  # (KV head, split, sequence)


@pytest.mark.parametrize(
    ("gpu", "ctx", "pool"),
    [
        ("NVIDIA H200", LARGE, "full"),  # another GPU: DECODE_CFG, the default order
        (H100, LARGE, "ring"),  # a sliding layer: the same
        (H100, LARGE[:5], "full"),  # a small launch: SMALL_DECODE_CFG
    ],
    ids=["h200", "sliding", "small"],
)
def test_other_launches_keep_their_settings(monkeypatch, gpu, ctx, pool):
    from gptoss.kernels import attention

    launch = _launch(monkeypatch, gpu, ctx, pool)
    small = len(ctx) <= attention.SMALL_DECODE
    block_n, warps, stages = attention.SMALL_DECODE_CFG if small else attention.DECODE_CFG
    assert {k: launch[k] for k in KEYS} == {
        "BLOCK_N": block_n,
        "num_warps": warps,
        "num_stages": stages,
        "HEADS_FIRST": False,
    }
    assert launch["grid"][1:] == (len(ctx), 2)  # (split, sequence, KV head)


def test_an_a_b_variable_turns_the_gpus_setting_off(monkeypatch):
    """GPTOSS_ATTN_DECODE or GPTOSS_ATTN_HEADS_FIRST set: that setting on every layer, as an A/B run asks."""
    monkeypatch.delenv("GPTOSS_ATTN_DECODE", raising=False)
    monkeypatch.delenv("GPTOSS_ATTN_HEADS_FIRST", raising=False)
    try:
        assert reread_settings().FULL_DECODE_BY_GPU == {"H100": ((32, 2, 3), True)}
        monkeypatch.setenv("GPTOSS_ATTN_HEADS_FIRST", "0")
        assert reread_settings().FULL_DECODE_BY_GPU == {}
        monkeypatch.delenv("GPTOSS_ATTN_HEADS_FIRST")
        monkeypatch.setenv("GPTOSS_ATTN_DECODE", "64,2,3")
        attention = reread_settings()
        assert attention.FULL_DECODE_BY_GPU == {} and attention.DECODE_CFG == (64, 2, 3)
    finally:
        monkeypatch.undo()
        reread_settings()

"""The preloading decode GEMV (gptoss.kernels.gemv_preload) against float32 F.linear, and linear()'s
switch to it (GPTOSS_GEMV=preload).

Runs in Triton's interpreter without CUDA and compiled on a GPU machine (kernelkit decides which),
with PDL (the loads of W before the wait) where the GPU has it.
"""

from __future__ import annotations

import pytest
import torch

import gptoss.kernels.linear as lin
from gptoss.kernels.gemv_preload import MAX_T, early_from_env, gemv_preload, k_parts, tiles_from_env
from tests.gptoss.kernels.conftest import sass_json
from tests.gptoss.kernels.test_linear import DEV, operands, reference

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")


def test_k_parts_split_k_into_two_power_of_two_tiles():
    assert k_parts(2880) == (2048, 1024)  # QKV's K: 2048 + 832 of a 1024 tile
    assert k_parts(4096) == (4096, 0)  # O's K: one tile
    assert k_parts(300) == (256, 64)
    assert k_parts(40) == (32, 8)
    assert k_parts(1) == (1, 0)
    with pytest.raises(ValueError, match="K must be positive"):
        k_parts(0)


def test_tiles_from_env():
    assert tiles_from_env(None) == (2, 4) and tiles_from_env("") == (2, 4)
    assert tiles_from_env("8,8") == (8, 8)
    for bad in ("8", "3,4", "8,4,2", "a,4", "0,4"):
        with pytest.raises(ValueError, match="GPTOSS_GEMV_PRELOAD_TILE must be BN,WARPS"):
            tiles_from_env(bad)


@pytest.mark.parametrize("t", [1, 2])
@pytest.mark.parametrize(("n", "k"), [(77, 96), (64, 40), (130, 300), (33, 128)])
@pytest.mark.parametrize("bias", [True, False])
def test_bf16_matches_float32_reference(t, n, k, bias):
    x, w, b = operands(t, n, k, torch.bfloat16, bias, seed=t * 1000 + n + k)
    y = gemv_preload(x, w, b)
    want = reference(x, w, b)  # [T, N] float32
    assert y.dtype == torch.bfloat16 and y.shape == (t, n)
    # One rounding of a float32 sum to bf16 (half an ulp, 2^-8 relative) plus the sum's order error.
    err = (y.float() - want).abs()
    assert bool((err <= want.abs() * 2**-8 + 1e-4).all()), float(err.max())
    assert (y == want.bfloat16()).float().mean().item() >= 0.99


@pytest.mark.parametrize(("bn", "warps"), [(1, 1), (8, 2), (16, 4)])
def test_tiles_do_not_change_a_row(bn, warps):
    """A row's sum is a tree over K alone: the same bits at any BN and warp count."""
    x, w, b = operands(2, 50, 300, torch.bfloat16, True, seed=5)
    assert torch.equal(gemv_preload(x, w, b, block_n=bn, num_warps=warps), gemv_preload(x, w, b))


@pytest.mark.parametrize("early", [0, 1, 3])
def test_rows_loaded_after_the_wait_give_the_same_bits(early):
    """GPTOSS_GEMV_PRELOAD_EARLY moves loads of W across the wait; the values stay the same."""
    x, w, b = operands(2, 50, 300, torch.bfloat16, True, seed=6)
    assert torch.equal(gemv_preload(x, w, b, block_n=4, early_rows=early), gemv_preload(x, w, b, block_n=4))


def test_early_from_env():
    assert early_from_env(None) is None and early_from_env("all") is None and early_from_env("") is None
    assert early_from_env("0") == 0 and early_from_env("2") == 2
    with pytest.raises(ValueError, match="GPTOSS_GEMV_PRELOAD_EARLY must be all or a row count, got 'half'"):
        early_from_env("half")


def test_float32_matches_f_linear():
    x, w, b = operands(2, 77, 96, torch.float32, True, seed=2)
    torch.testing.assert_close(gemv_preload(x, w, b), reference(x, w, b), rtol=1e-5, atol=1e-5)


def test_rows_do_not_depend_on_the_batch():
    x, w, b = operands(2, 77, 300, torch.bfloat16, True, seed=7)
    together = gemv_preload(x, w, b)  # [2, N]
    for i in (0, 1):
        assert torch.equal(gemv_preload(x[i : i + 1], w, b), together[i : i + 1])


def test_strided_x_rows():
    x, w, b = operands(2, 33, 64, torch.bfloat16, True, seed=3)
    wide = torch.zeros(2, 80, dtype=x.dtype, device=DEV)
    wide[:, :64] = x
    assert torch.equal(gemv_preload(wide[:, :64], w, b), gemv_preload(x, w, b))


def test_rejects_what_it_does_not_take():
    x, w, b = operands(MAX_T + 1, 40, 64, torch.bfloat16, True, seed=4)
    with pytest.raises(ValueError, match=rf"1 <= T <= {MAX_T}.*x \({MAX_T + 1}, 64\)"):
        gemv_preload(x, w, b)
    with pytest.raises(ValueError, match="of one dtype"):
        gemv_preload(x[:1], w.float(), None)
    with pytest.raises(ValueError, match="contiguous last dim"):
        gemv_preload(x[:1], w, torch.zeros(80, dtype=x.dtype, device=DEV)[::2])


def test_linear_takes_it_on_cuda_when_switched_on(monkeypatch):
    calls = []

    def spy(x, w, b):
        calls.append((x.shape[0], w.shape[0]))
        return gemv_preload(x, w, b)

    monkeypatch.setattr(lin, "gemv_preload", spy)
    monkeypatch.setattr(lin, "GEMV", "preload")
    # one token takes it for a tall W (QKV) and a wide one (O); two tokens for a wide W only; T 3 never
    for t, n, k in ((1, 96, 77), (MAX_T, 96, 77), (MAX_T, 40, 64), (MAX_T + 1, 40, 64)):
        x, w, b = operands(t, n, k, torch.bfloat16, True, seed=t)
        want = gemv_preload(x, w, b) if DEV == "cuda" and (t == 1 or (t <= MAX_T and k > n)) else None
        y = lin.linear(x, w, b)
        if want is not None:
            assert torch.equal(y, want)
    assert calls == ([(1, 96), (MAX_T, 40)] if DEV == "cuda" else [])
    monkeypatch.setattr(lin, "GEMV", "dot")
    x, w, b = operands(1, 40, 64, torch.bfloat16, True, seed=1)
    lin.linear(x, w, b)
    assert len(calls) == (2 if DEV == "cuda" else 0)


def test_gemv_switch_values():
    assert lin.gemv_from_env(None) == "stream" and lin.gemv_from_env("") == "stream"
    assert lin.gemv_from_env("preload") == "preload" and lin.gemv_from_env("dot") == "dot"
    with pytest.raises(ValueError, match="GPTOSS_GEMV='fast': dot, preload or stream"):
        lin.gemv_from_env("fast")


def test_the_sm90a_code_loads_all_of_w_before_the_pdl_wait():
    """Compiled for sm_90a on CPU by bench/kernels/pdl_wait_sass.py (a process without the
    interpreter): every one of W's 16-byte loads and the bias's (at most one a row) come before
    griddepcontrol.wait (ACQBULK), which comes before the release (PREEXIT); after it only x is
    loaded (fewer loads than W's); no spills."""
    got = sass_json("pdl_wait_sass.py")
    others = ["norm_logits", "rmsnorm", "attention reduce"]
    others += ["attention", "attention rope", "attention rope preload"]
    others += [f"stream {n} 2x4{t}" for n in ("o", "qkv") for t in ("", " two")]
    for other in others:  # their own tests'
        got.pop(other)
    assert len(got) == 8

    def w_loads(shape: str, bn: int, warps: int) -> int:
        k1, k2 = k_parts({"o": 4096, "qkv": 2880}[shape])
        return bn * (k1 + k2) * 2 // (16 * 32 * warps)

    # GPTOSS_GEMV_PRELOAD_EARLY: 2 of O's 4 rows before the wait load half of W there (and the bias);
    # 0 none: W, the bias and x all after it
    bias = got["o 4x4"]["ldg_before_wait"] - w_loads("o", 4, 4)
    assert got.pop("o 4x4 early 2")["ldg_before_wait"] == w_loads("o", 4, 4) // 2 + bias
    early0 = got.pop("o 4x4 early 0")
    whole = got["o 4x4"]["ldg_before_wait"] + got["o 4x4"]["ldg_after_wait"]
    assert early0["ldg_before_wait"] == 0 and early0["ldg_after_wait"] == whole
    for name, v in got.items():
        shape, tile = name.split()
        bn, warps = map(int, tile.split("x"))
        assert 1 <= v["ldg_before_wait"] - w_loads(shape, bn, warps) <= bn, name  # the bias's
        assert 0 < v["ldg_after_wait"] < w_loads(shape, bn, warps), name
        assert v["spills"] == 0 and v["wait_then_release"], name

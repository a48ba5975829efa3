"""The one-wave decode GEMV (gptoss.kernels.gemv_stream): the bits of gemv_preload at the same tiles,
whatever the grid and however many row blocks a program walks, and linear()'s switch to it
(GPTOSS_GEMV=stream, the default).

Runs in Triton's interpreter on CPU (there the grid is sized for gemv_stream.SMS_OFF_GPU "SMs", so a
program walks several blocks); on a GPU machine the same tests run compiled, with PDL where the GPU
has it.
"""

from __future__ import annotations

import pytest
import torch

import gptoss.kernels.linear as lin
from gptoss.kernels import gemv_stream as gs
from gptoss.kernels.gemv_preload import MAX_T, gemv_preload
from tests.gptoss.kernels.conftest import record_launches, sass_json
from tests.gptoss.kernels.test_linear import DEV, operands, reference

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")


def test_programs_keep_the_most_blocks_a_program_and_no_more_programs():
    # 120b's QKV and O at BN 2 on an H200 at 4 programs an SM (528 slots): 5 and 3 blocks each
    assert gs.programs(2560, 528) == 512 and gs.programs(1440, 528) == 480
    assert gs.programs(39, 8) == 8  # 5 blocks a program at most: 8 programs, the last with 4
    assert gs.programs(6, 8) == 6 and gs.programs(1, 528) == 1
    assert gs.programs(16, 8) == 8 and gs.programs(17, 8) == 6  # 17: 3 a program at most -> 6
    with pytest.raises(ValueError, match="blocks and slots must be >= 1, got 0, 8"):
        gs.programs(0, 8)


@pytest.mark.parametrize("t", [1, 2])
@pytest.mark.parametrize(("n", "k"), [(77, 96), (64, 40), (130, 300), (3, 128)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("per_sm", [1, 4])
def test_the_same_bits_as_gemv_preload(t, n, k, bias, per_sm, monkeypatch):
    """At BN 2 (4 warps) the interpreter's grid is 2 * per_sm programs at most, so n 130 (65 blocks)
    has a program walk up to 33 blocks and n 3 (2 blocks) has fewer blocks than slots."""
    x, w, b = operands(t, n, k, torch.bfloat16, bias, seed=t * 1000 + n + k)
    grids = record_launches(monkeypatch, gs, "_gemv_stream_kernel", "TWO")
    got = gs.gemv_stream(x, w, b, block_n=2, num_warps=4, per_sm=per_sm)
    assert got.dtype == torch.bfloat16 and got.shape == (t, n)
    assert torch.equal(got, gemv_preload(x, w, b, block_n=2, num_warps=4))
    assert grids == [t > 1]
    want = reference(x, w, b)
    err = (got.float() - want).abs()
    assert bool((err <= want.abs() * 2**-8 + 1e-4).all()), float(err.max())


@pytest.mark.parametrize(("bn", "warps"), [(1, 1), (4, 2), (8, 4)])
def test_other_tiles_keep_the_bits(bn, warps):
    x, w, b = operands(2, 50, 300, torch.bfloat16, True, seed=5)
    assert torch.equal(
        gs.gemv_stream(x, w, b, block_n=bn, num_warps=warps, per_sm=1),
        gemv_preload(x, w, b, block_n=bn, num_warps=warps),
    )


def test_float32_matches_f_linear_and_a_token_does_not_depend_on_the_batch():
    x, w, b = operands(2, 77, 96, torch.float32, True, seed=2)
    together = gs.gemv_stream(x, w, b)
    torch.testing.assert_close(together, reference(x, w, b), rtol=1e-5, atol=1e-5)
    for i in (0, 1):
        assert torch.equal(gs.gemv_stream(x[i : i + 1], w, b), together[i : i + 1])


def test_strided_x_rows_and_what_it_refuses():
    x, w, b = operands(2, 33, 64, torch.bfloat16, True, seed=3)
    wide = torch.zeros(2, 80, dtype=x.dtype, device=DEV)
    wide[:, :64] = x
    assert torch.equal(gs.gemv_stream(wide[:, :64], w, b), gs.gemv_stream(x, w, b))
    x3, w3, b3 = operands(MAX_T + 1, 40, 64, torch.bfloat16, True, seed=4)
    with pytest.raises(ValueError, match=rf"gemv_stream needs x \[T, K\] with 1 <= T <= {MAX_T}"):
        gs.gemv_stream(x3, w3, b3)
    with pytest.raises(ValueError, match="of one dtype"):
        gs.gemv_stream(x3[:1], w3.float(), None)


def test_switch_values_are_refused_by_name():
    assert gs.per_sm_from_env(None) == gs.per_sm_from_env("") == (4, 3)
    assert gs.per_sm_from_env("2") == (2, 2) and gs.per_sm_from_env("5,2") == (5, 2)
    for bad in ("0", "x", "-1", "4,0", "1,2,3"):
        with pytest.raises(ValueError, match=f"GPTOSS_GEMV_STREAM_PER_SM must be .*got {bad!r}"):
            gs.per_sm_from_env(bad)
    with pytest.raises(ValueError, match="GPTOSS_GEMV_STREAM_TILE must be BN,WARPS"):
        gs.tiles_from_env("3,4", "GPTOSS_GEMV_STREAM_TILE")
    assert lin.gemv_from_env("stream") == "stream"


def test_linear_takes_it_on_cuda_when_switched_on(monkeypatch):
    """GPTOSS_GEMV=stream: where gemv_preload would run (one token; two for a wide W), gemv_stream runs
    instead; CPU tensors keep F.linear."""
    calls = []

    def spy(x, w, b):
        calls.append((x.shape[0], w.shape[0]))
        return gs.gemv_stream(x, w, b)

    monkeypatch.setattr(lin, "gemv_stream", spy)
    monkeypatch.setattr(lin, "gemv_preload", lambda *a: pytest.fail("gemv_preload ran with GEMV=stream"))
    monkeypatch.setattr(lin, "GEMV", "stream")
    for t, n, k in ((1, 96, 77), (MAX_T, 96, 77), (MAX_T, 40, 64), (MAX_T + 1, 40, 64)):
        x, w, b = operands(t, n, k, torch.bfloat16, True, seed=t)
        y = lin.linear(x, w, b)
        torch.testing.assert_close(y.float(), reference(x, w, b), rtol=2**-7, atol=1e-3)
    assert calls == ([(1, 96), (MAX_T, 40)] if DEV == "cuda" else [])


@pytest.mark.parametrize(("shape", "k"), [("o", 4096), ("qkv", 2880)])
@pytest.mark.parametrize("two", [False, True])
def test_the_sm90a_code_fits_per_sm_programs_and_loads_the_first_block_before_the_wait(shape, k, two):
    """Compiled for sm_90a on CPU (bench/kernels/pdl_wait_sass.py), BN 2 x 4 warps: no spills; the
    registers of PER_SM's programs fit an SM's 64K (else the grid would not run as one wave); the
    first block's W (BN*K*2 bytes in 16-byte loads over 128 threads) and bias (one load a row) load
    before griddepcontrol.wait, the release after it."""
    got = sass_json("pdl_wait_sass.py")[f"stream {shape} 2x4{' two' if two else ''}"]
    assert got["spills"] == 0 and got["wait_then_release"]
    per_sm = gs.PER_SM[two]
    assert per_sm * 128 * got["regs"] <= 65536, (per_sm, got["regs"])
    k1, k2 = gs.k_parts(k)
    assert got["ldg_before_wait"] == 2 * (k1 + k2) * 2 // (16 * 128) + 2
    # after it: x's row(s) and the next block's W and bias, no more
    assert got["ldg_after_wait"] <= (1 + two) * 4 + got["ldg_before_wait"]

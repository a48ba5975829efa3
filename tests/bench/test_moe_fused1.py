"""bench/kernels/moe_fused1.py: one launch (and its two-launch A/B) computes batch 1's act and y as the
reference does (the checkpoint's weights decoded by gptoss.mxfp4.dequantize, float64, swiglu of
gptoss.model), leaves its counters at zero for the next call, and refuses mismatched splits. In
Triton's interpreter (programs one by one, so the spins pass), float32: relative 1e-5."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated by triton.jit
pytest.importorskip("triton")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "kernels"))

import moe_fused1  # noqa: E402

from gptoss.kernels.moe_tiles import DecTiles  # noqa: E402
from gptoss.model import swiglu  # noqa: E402
from gptoss.mxfp4 import dequantize  # noqa: E402
from tests.gptoss.kernels.moekit import ALPHA, DEV, LIMIT, make_moe  # noqa: E402

E, H, I = 4, 320, 192  # K 320 = 5 chunks (masked past it at BK 128); I 192: 2I / BN 32 = 12 programs


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).norm() / want.norm()).item()


@pytest.mark.parametrize("phase", [0, 1])
@pytest.mark.parametrize(
    ("gt", "dt"),
    [
        (DecTiles(1, 32, 128, 2, 2, 2), DecTiles(1, 32, 128, 2, 2, 2)),
        (DecTiles(1, 64, 256, 2, 2, 2), DecTiles(1, 16, 256, 2, 2, 3)),  # 2I / 64: 6 a slot, H / 16: 20
    ],
)
def test_act_and_y_match_the_reference(phase, gt, dt):
    ref, w = make_moe(E, H, I, 2, torch.float32, seed=3, kernels="v3")
    x = torch.randn(1, H, generator=torch.Generator().manual_seed(4)).to(DEV)
    ids = torch.tensor([3, 1, 0], dtype=torch.int32, device=DEV)
    cnt = torch.zeros(4, dtype=torch.int32, device=DEV)
    act, y = moe_fused1.fused1(x, ids, w, ALPHA, LIMIT, gt, dt, phase, cnt)
    ex = ref.experts
    for j, e in enumerate(ids.tolist()):
        w13 = dequantize(ex.gate_up_blocks[e], ex.gate_up_scales[e], torch.float32).double()
        want_act = swiglu(x.double() @ w13.T + ex.gate_up_bias[e].double(), ALPHA, LIMIT)[0]
        assert _rel(act[j], want_act) <= 1e-5
        w2 = dequantize(ex.down_blocks[e], ex.down_scales[e], torch.float32).double()
        # y from the kernel's own act (float32), so only y's sums are compared here
        assert _rel(y[j], act[j].double() @ w2.T + ex.down_bias[e].double()) <= 1e-5
    assert cnt.tolist() == [0, 0, 0, 0]  # phase 0 sets them back; the A/B never touches them


def test_one_split_for_both_gemms_and_copies_the_gpu_runs(monkeypatch):
    _, w = make_moe(E, H, I, 2, torch.float32, seed=3, kernels="v3")
    x = torch.zeros(1, H, device=DEV)
    ids = torch.tensor([0, 1], dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="one split for both GEMMs"):
        moe_fused1.fused1(
            x, ids, w, ALPHA, LIMIT, DecTiles(1, 32, 128, 2, 2, 2), DecTiles(1, 32, 512, 4, 4, 3)
        )
    monkeypatch.setattr(moe_fused1.triton.knobs.runtime, "interpret", False)  # as on a GPU: checked first
    with pytest.raises(ValueError, match="2 chunks a warp or more"):  # 1 a warp faulted on an H200 (v58)
        moe_fused1.fused1(
            x, ids, w, ALPHA, LIMIT, DecTiles(1, 32, 128, 2, 2, 2), DecTiles(1, 16, 128, 2, 2, 3)
        )

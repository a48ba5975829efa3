"""bench/kernels/moe_ws.py, the warp-specialized batch-1 GEMM in Gluon (no interpreter runs Gluon):
compiled for sm_90a on CPU, its consumer loop holds a step's 16 mma.sync and 64 scale multiplies with
no block barrier (the copies are another partition's), the copy partition gives its registers back,
and bad arguments are refused before any launch. On a GPU its product equals the dequantized weights
times x in float64 (relative 1e-5), at one and two K parts, one or two row blocks a consumer warp,
its words read before or after the MMAs."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "kernels"))

import moe_ws  # noqa: E402

from gptoss.mxfp4 import dequantize  # noqa: E402
from tests.bench.gpu_stubs import run_compiler_tool  # noqa: E402
from tests.gptoss.kernels.moekit import make_moe  # noqa: E402


def _consumer_loop(stdout: str) -> dict[str, int]:
    line = re.search(r"^consumer K loop (\d+) ins: (.*)$", stdout, re.M)
    ops = {o: int(c) for o, c in (x.rsplit(" ", 1) for x in line[2].split(", "))}
    assert sum(ops.values()) == int(line[1])
    return ops


def test_the_consumer_loop_has_the_mmas_and_no_block_barrier():
    p = run_compiler_tool("moe_ws.py", "--regs", "72", "--maxnreg", "48")
    assert p.returncode == 0, p.stderr
    assert re.search(r"^warps 8, regs 48,", p.stdout, re.M)  # 4 copy warps + 4 consumers, capped at 48
    assert re.search(r"^setmaxnreg dec 24, inc 72; spills 0$", p.stdout, re.M)
    ops = _consumer_loop(p.stdout)
    # BK 256 = 4 chunks x 4 k16 steps of one 16-row block: 16 MMAs, 16 words of 4 HMUL2 each
    assert ops["HMMA"] == 16 and ops["HMUL2"] == 64
    assert "BAR" not in ops  # the engine's split-K loop has 4 block barriers a step (v61)
    assert (
        "UTMALDG" not in ops and ops["SYNCS"] == 2
    )  # the copies are the other partition's: a wait, an arrive


def test_bad_arguments_are_refused_before_a_launch():
    _, w = make_moe(2, 128, 64, 2, torch.float32, seed=1, kernels="v3")
    x = torch.zeros(1, 128, dtype=torch.bfloat16)
    ids = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(ValueError, match="N 96 must be a multiple of 64 \\(4 16-row blocks\\)"):
        moe_ws.ws_gemv(x, ids, w.w13[:, :96], w.s13[:, :96], 128)
    with pytest.raises(ValueError, match="kparts 2 must divide the 1 K steps, rbw 1 be 1 or 2"):
        moe_ws.ws_gemv(x, ids, w.w13, w.s13, 128, kparts=2)
    with pytest.raises(ValueError, match="kparts 1 must divide the 1 K steps, rbw 3 be 1 or 2"):
        moe_ws.ws_gemv(x, ids, w.w13, w.s13, 128, rbw=3)
    with pytest.raises(ValueError, match="x one bf16 row of K 128; got x \\(1, 128\\) torch.float32"):
        moe_ws.ws_gemv(x.float(), ids, w.w13, w.s13, 128)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="Gluon kernels run on a GPU only")
@pytest.mark.parametrize(("kparts", "rbw", "pf"), [(1, 1, False), (2, 1, True), (1, 2, False), (2, 2, True)])
def test_the_product_matches_the_dequantized_weights(kparts, rbw, pf):
    e, h, i = 4, 320, 64  # gate_up: N = 2I = 128 (2 row tiles), K 320 (the 2nd step past K is zeros)
    ref, w = make_moe(e, h, i, 2, torch.bfloat16, seed=5, kernels="v3")
    x = torch.randn(1, h, generator=torch.Generator().manual_seed(6)).to("cuda", torch.bfloat16)
    ids = torch.tensor([3, 1, 0], dtype=torch.int32, device="cuda")
    got = moe_ws.ws_gemv(x, ids, w.w13, w.s13, h, kparts=kparts, rbw=rbw, pf=pf)
    assert got.shape == (kparts, 3, 2 * i)
    ex = ref.experts
    for j, ex_id in enumerate(ids.tolist()):
        w13 = dequantize(ex.gate_up_blocks[ex_id], ex.gate_up_scales[ex_id], torch.float32).double()
        pre = w13 @ x[0].double()  # the checkpoint's rows alternate gate, up
        # the v3 rows 16b + 8h + g hold plane h's row 8b + g (h 0: gate, 1: up)
        v3 = got[:, j].sum(0).double().view(i // 8, 2, 8)
        for plane, want in ((v3[:, 0].reshape(i), pre[0::2]), (v3[:, 1].reshape(i), pre[1::2])):
            assert ((plane - want).norm() / want.norm()).item() <= 1e-5

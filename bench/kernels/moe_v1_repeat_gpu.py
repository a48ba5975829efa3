"""Where do v1's GEMMs with the portable dequant (moe_common.USE_ASM off) go wrong at 20b's shapes?
tests/gptoss/kernels/test_moe_kernel.py::test_20b_shape_on_gpu[v1-1024-False] failed twice on an H200
(rel error inf in session 55, 1.88e33 in session 57 with its x seeded) and passed in between. Each
run here takes that test's inputs (make_moe seed = T, x seeded by T) and prints, for the gate_up and
the down apart, how many distinct outputs N runs give, and each against the same GEMM with the PTX
dequant: how many values differ by more than 1e-2 of the largest, in which rows and columns.

    python bench/kernels/moe_v1_repeat_gpu.py [--runs 5] [--tokens 1024,4096] \
        [--down-tiles 128,128,128,8,3 ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

sys.path.insert(0, str(Path(__file__).resolve().parent))
from moe_repeat_gpu import distinct  # noqa: E402

from gptoss.kernels import moe, moe_common  # noqa: E402
from gptoss.kernels.moe_routing import route_and_group  # noqa: E402
from gptoss.kernels.moe_tiles import Tiles  # noqa: E402
from tests.gptoss.kernels.moekit import ALPHA, LIMIT, make_moe  # noqa: E402


def _far(a: torch.Tensor, b: torch.Tensor) -> str:
    """Where a is far from b (more than 1e-2 of b's largest magnitude), or non-finite."""
    a, b = a.float(), b.float()
    d = ~((a - b).abs() <= 1e-2 * b.abs().max())  # NaN and inf count as far
    idx = d.nonzero()
    if idx.numel() == 0:
        return "close"
    rows, cols = idx[:, 0].unique(), idx[:, 1].unique()
    worst = a[d].abs().max().item()
    return (
        f"{idx.shape[0]} far: rows {rows.numel()} ({rows[:6].tolist()}..), cols {cols.numel()} "
        f"({cols[:6].tolist()}..), largest |value| there {worst:.2e} (b's largest {b.abs().max().item():.2e})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tokens", default="1024,4096")
    ap.add_argument(
        "--down-tiles",
        action="append",
        default=[],
        help="BM,BN,BK,WARPS,STAGES: the down also on these tiles, each path, --runs times (repeatable)",
    )
    args = ap.parse_args()
    for t in map(int, args.tokens.split(",")):
        ref, w = make_moe(32, 2880, 2880, 4, torch.bfloat16, seed=t, kernels="v1")
        x = torch.randn(t, 2880, device="cuda", generator=torch.Generator("cuda").manual_seed(t)).bfloat16()
        r = route_and_group(F.linear(x, ref.router_weight, ref.router_bias), 4)
        gu = moe.choose_tiles(t, 4, 32, 2880, 2880, gate_up=True)
        dn = moe.choose_tiles(t, 4, 32, 2880, 2880, gate_up=False)
        got = {}
        for asm in (True, False):
            moe_common.USE_ASM = asm
            acts = [moe.gate_up(x, r, w, ALPHA, LIMIT, gu) for _ in range(args.runs)]
            ys = [moe.down(acts[0], r, w, dn) for _ in range(args.runs)]
            torch.cuda.synchronize()
            got[asm] = (acts, ys)
            print(
                f"T {t} asm={asm} gate_up {gu}: {distinct(acts)} distinct of {args.runs}; "
                f"down {dn}: {distinct(ys)} distinct"
            )
        (acts_a, ys_a), (acts_p, ys_p) = got[True], got[False]
        for i in range(args.runs):
            print(f"  run {i}: gate_up portable vs PTX: {_far(acts_p[i], acts_a[0])}")
            print(f"  run {i}: down portable vs PTX (its own act): {_far(ys_p[i], ys_a[0])}")
        for spec in args.down_tiles:
            bm, bn, bk, warps, stages = map(int, spec.split(","))
            tiles = Tiles(bm, bn, bk, warps, stages)
            for asm in (True, False):
                moe_common.USE_ASM = asm
                ys = [moe.down(acts_a[0], r, w, tiles) for _ in range(args.runs)]
                torch.cuda.synchronize()
                far = sorted({_far(y, ys_a[0]) for y in ys})
                print(f"T {t} down {tiles} asm={asm}: {distinct(ys)} distinct of {args.runs}; {far[:3]}")
        moe_common.USE_ASM = True


if __name__ == "__main__":
    main()

"""Is the v3 down GEMM deterministic? Each case runs the same down N times by cp.async pointers and
N times with its weights by TMA (moe_v3.TMA_W), and prints how many distinct outputs each path gave
and where the two paths differ. Made for the BK-64 down tiles whose TMA run once differed from the
pointer path (bench/results v30: 1 failure in 3 runs of
test_weights_by_tma_give_the_pointer_paths_bits_on_gpu).

    python bench/kernels/moe_repeat_gpu.py [--runs 20]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gptoss.kernels import moe, moe_v3  # noqa: E402
from gptoss.kernels.moe import Tiles  # noqa: E402
from gptoss.kernels.moe_routing import route_and_group  # noqa: E402
from tests.gptoss.kernels.moekit import ALPHA, LIMIT, make_moe  # noqa: E402

CASES = [  # (experts, tokens, down tiles)
    (128, 1024, Tiles(64, 128, 64, 8, 3, half=True)),  # the test's case that failed once
    (128, 4096, Tiles(128, 128, 64, 8, 3, half=True)),  # BM 128: the half body too
    (128, 1024, Tiles(64, 128, 128, 4, 4, half=True)),  # 120b's few-rows down until v46
    (128, 1024, Tiles(64, 128, 128, 4, 3, half=True, maxnreg=168)),  # 120b's default few-rows down
    (32, 1024, Tiles(256, 128, 64, 8, 4, half=True)),  # 20b's bucket 128 (TMA only with WTMA=1)
]


def _where(a: torch.Tensor, b: torch.Tensor) -> str:
    d = (a != b).nonzero()
    if d.numel() == 0:
        return "same"
    rows, cols = d[:, 0].unique(), d[:, 1].unique()
    span = f"rows {rows.numel()} ({rows.min()}..{rows.max()})"
    worst = (a.float() - b.float()).abs().max().item() / max(a.float().abs().max().item(), 1e-30)
    return f"{d.shape[0]} values, {span}, cols {cols.min()}..{cols.max()}, max|diff|/max|y| {worst:.2e}"


def distinct(outs: list[torch.Tensor]) -> int:
    """How many bitwise-distinct tensors outs holds (16-bit outputs)."""
    return len({o.view(torch.int16).flatten().cpu().numpy().tobytes() for o in outs})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    for e, tokens, dn in CASES:
        ref, w = make_moe(e, 2880, 2880, 4, torch.bfloat16, seed=3, kernels="v3")
        x = torch.randn(
            tokens, 2880, device="cuda", generator=torch.Generator("cuda").manual_seed(0)
        ).bfloat16()
        r = route_and_group(F.linear(x, ref.router_weight, ref.router_bias), 4)
        moe_v3.TMA_W = "0"
        act = moe.gate_up_v3(x, r, w, ALPHA, LIMIT, Tiles(64, 64, 128, 4, 3, half=True))
        first = {}
        for mode in ("0", "1"):
            moe_v3.TMA_W = mode
            outs = [moe.down_v3(act, r, w, dn) for _ in range(args.runs)]
            torch.cuda.synchronize()
            bad = [_where(outs[0], o) for o in outs if not torch.equal(outs[0], o)]
            first[mode] = outs[0]
            print(f"E {e} T {tokens} {dn} WTMA={mode}: {distinct(outs)} distinct of {args.runs}; {bad[:2]}")
        print(f"  pointer vs TMA, first runs: {_where(first['0'], first['1'])}")


if __name__ == "__main__":
    main()

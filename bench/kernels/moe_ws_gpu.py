"""The warp-specialized batch-1 GEMM (moe_ws, Gluon) beside the engine's split-K decode GEMMs and
moe_ablate's "full" copy of them (the same product, no bias or SwiGLU), as CUDA-graph replays.

    python3 bench/kernels/moe_ws_gpu.py [--layers 24] [--ws BK,NBUF,REGS,MAXNREG,KPARTS,RBW,PF;...]

One token, bf16, E 32, H = I = 2880, top-4 on distinct experts; LAYERS distinct weight copies read in
turn (each call from HBM). Each ws variant is first checked against the "full" kernel's output (the
engine's K step; relative norm of the difference ≤ 1e-3, else the row says failed and the bench
exits 1), then timed (kparts > 1: the kernel's partial sums, not their sum, as moe_ablate; RBW:
row blocks a consumer warp; PF 1: the next step's words read before this step's MMAs). Rows: µs a
call, share of the copy bandwidth on the bytes read, time against the engine's kernel for the same
GEMM.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import hbm  # noqa: E402
import moe_ablate  # noqa: E402
import moe_ws  # noqa: E402
from moe_ablate_gpu import batch1_cases  # noqa: E402
from timing import case_failed, graph_us, print_table, report  # noqa: E402

TOL = 1e-3


def _variants(spec: str) -> list[tuple[int, ...]]:
    return [tuple(map(int, item.split(","))) for item in filter(None, spec.split(";"))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument(
        "--ws",
        default="256,4,96,64,1,1,0;256,4,96,64,1,1,1;256,4,96,64,1,2,0;256,4,96,64,1,2,1;256,4,96,64,2,2,1",
    )
    args = ap.parse_args()
    layers, layer, gemms, engine = batch1_cases(args.experts, args.layers)
    rows: list[str] = []
    for name, (tiles, mb, k, words, xin) in gemms.items():
        base = graph_us(engine[name], args.layers)
        rows.append(
            f"| {name} | engine {tiles} | {base:.2f} | {hbm.share(mb * 1e6, base) * 100:.1f} % | 1.00 | – |"
        )

        def full(tiles=tiles, k=k, words=words, xin=xin):
            w, x, _, ids = layer()
            return moe_ablate.ablate(xin(x), ids, *words(w), k, tiles, "full")

        us = graph_us(full, args.layers)
        share = hbm.share(mb * 1e6, us) * 100
        rows.append(f"| {name} | ablate full | {us:.2f} | {share:.1f} % | {us / base:.2f} | – |")
        for bk, nbuf, regs, maxnreg, kparts, rbw, pf in _variants(args.ws):
            what = f"ws BK {bk} NBUF {nbuf} regs {regs} maxnreg {maxnreg} kparts {kparts} RBW {rbw} PF {pf}"
            opts = (bk, nbuf, regs, maxnreg, kparts, rbw, bool(pf))

            def call(opts=opts, k=k, words=words, xin=xin):
                w, x, _, ids = layer()
                return moe_ws.ws_gemv(xin(x), ids, *words(w), k, *opts)

            try:
                w, x, _, ids = layers[0]
                want = moe_ablate.ablate(xin(x), ids, *words(w), k, tiles, "full")[0]
                got = moe_ws.ws_gemv(xin(x), ids, *words(w), k, *opts).sum(0)
                err = ((got - want).norm() / want.norm()).item()
                if not err <= TOL:
                    raise AssertionError(f"relative error {err:.3g} against the full kernel (limit {TOL})")
                us = graph_us(call, args.layers)
            except Exception as e:  # noqa: BLE001 - counted by case_failed; the bench exits 1 after its table
                case_failed(f"{name} {what}", e)
                rows.append(f"| {name} | {what} | failed: {type(e).__name__} | – | – | – |")
                continue
            share = hbm.share(mb * 1e6, us) * 100
            rows.append(f"| {name} | {what} | {us:.2f} | {share:.1f} % | {us / base:.2f} | {err:.1e} |")
            print(rows[-1], file=sys.stderr, flush=True)  # partial results survive a lost run
    title = f"batch-1 decode GEMMs, warp-specialized (Gluon) against the engine's, E {args.experts}, "
    print_table(
        title + f"{args.layers} weight copies, bf16, " + torch.cuda.get_device_name(),
        ["GEMM", "kernel", "µs a call", "share of a copy", "against the engine", "rel. err"],
        rows,
    )
    if report():
        sys.exit(1)


if __name__ == "__main__":
    main()

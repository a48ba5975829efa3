"""Batch 1's decode MoE GEMMs in one launch (moe_fused1, phase 0) against the same code as two launches
(phases 1 and 2) and against the engine's gate_up + down, as CUDA-graph replays (timing.graph_us).

    python3 bench/kernels/moe_fused1_gpu.py [--experts 32] [--layers 24] [--pairs "64,512,3/32,512,3;.."]

LAYERS distinct copies of the experts, one a call in turn, so every call reads its weights from HBM.
One token, bf16, H = I = 2880, top-4 on distinct experts. Each pair is the gate_up's BN,BK,STAGES /
the down's, split over 4 warps (8 for BK/SPLIT = 64: the split is BK / 128). Before timing, each
pair's one launch is checked against its two launches (the same sums: equal bits) and against the
engine's kernels (relative error). Rows: µs a call and the share of the copy bandwidth on 53 MB.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import hbm  # noqa: E402
import moe_fused1  # noqa: E402
from timing import case_failed, graph_us, print_table, report  # noqa: E402

from gptoss.kernels import moe_v3_dec, moe_v3_dec_gu  # noqa: E402
from gptoss.kernels.moe_routing import Routing  # noqa: E402
from gptoss.kernels.moe_tiles import DecTiles  # noqa: E402
from tests.gptoss.kernels.moekit import ALPHA, LIMIT, make_moe  # noqa: E402

H = I = 2880
K = 4


def _pairs(spec: str, split: int) -> list[tuple[DecTiles, DecTiles]]:
    out = []
    for item in filter(None, spec.split(";")):
        g, d = ([int(v) for v in half.split(",")] for half in item.split("/"))
        out.append((DecTiles(1, g[0], g[1], split, split, g[2]), DecTiles(1, d[0], d[1], split, split, d[2])))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--split", type=int, default=4)
    ap.add_argument("--pairs", default="64,512,3/32,512,3;64,256,4/32,512,3;32,512,3/32,512,3")
    args = ap.parse_args()
    layers = []
    for seed in range(args.layers):
        _, w = make_moe(args.experts, H, I, K, torch.bfloat16, seed=seed, kernels="v3")
        x = torch.randn(1, H, device="cuda", dtype=torch.bfloat16)
        ids = torch.randperm(args.experts, device="cuda")[:K].to(torch.int32)
        logits = torch.full((1, args.experts), -10.0, device="cuda")  # routes to ids, in order
        logits[0, ids.long()] = torch.arange(K, 0, -1, device="cuda", dtype=torch.float32)
        layers.append((w, x, ids, logits))
    r = Routing.empty(1, K, args.experts, torch.device("cuda"))
    cnt = torch.zeros(K + 1, dtype=torch.int32, device="cuda")
    layer = itertools.cycle(layers).__next__  # the next copy a call: each read from HBM

    mb = 3 * K * H * (I // 2 + I // 32) / 1e6
    rows = []
    w0, x0, ids0, l0 = layers[0]
    want = moe_v3_dec.down_v3_dec(moe_v3_dec_gu.gate_up_v3_dec(x0, r, w0, ALPHA, LIMIT, logits=l0), r, w0)
    assert r.ids.view(-1).tolist() == ids0.tolist(), "the routed ids are the layer's"

    def engine(route: bool):
        w, x, _, logits = layer()  # without logits r keeps layer 0's routing: other experts, as many bytes
        act = moe_v3_dec_gu.gate_up_v3_dec(x, r, w, ALPHA, LIMIT, logits=logits if route else None)
        return moe_v3_dec.down_v3_dec(act, r, w)

    base = graph_us(lambda: engine(False), args.layers)
    routed = graph_us(lambda: engine(True), args.layers)
    share = hbm.share(mb * 1e6, base) * 100
    rows.append(f"| engine gate_up + down, routing as given | {base:.2f} | {share:.1f} % | 1.00 |")
    share = hbm.share(mb * 1e6, routed) * 100
    rows.append(
        f"| engine gate_up + down, routing the logits | {routed:.2f} | {share:.1f} % | {routed / base:.2f} |"
    )
    for gt, dt in _pairs(args.pairs, args.split):
        what = f"G {gt.bn},{gt.bk},{gt.stages} / D {dt.bn},{dt.bk},{dt.stages}, {gt.split} warps"
        try:
            one = moe_fused1.fused1(x0, ids0, w0, ALPHA, LIMIT, gt, dt, 0, cnt)[1]
            two = moe_fused1.fused1(x0, ids0, w0, ALPHA, LIMIT, gt, dt, 1)[1]
            torch.cuda.synchronize()
            same = torch.equal(one, two) and cnt.tolist() == [0] * (K + 1)
            err = ((one.double() - want.double()).norm() / want.double().norm()).item()
            print(f"{what}: one launch = two launches {same}, against the engine {err:.2e}", file=sys.stderr)
            if not same:
                case_failed(what, "one launch differs from two launches, or left its counters non-zero")
            for ph, name in ((1, "two launches"), (0, "one launch")):

                def call(ph=ph, gt=gt, dt=dt):
                    w, x, ids, _ = layer()
                    return moe_fused1.fused1(x, ids, w, ALPHA, LIMIT, gt, dt, ph, cnt)

                us = graph_us(call, args.layers)
                rows.append(
                    f"| {name}: {what} | {us:.2f} | {hbm.share(mb * 1e6, us) * 100:.1f} % | {us / base:.2f} |"
                )
                print(rows[-1], file=sys.stderr, flush=True)
        except Exception as e:  # noqa: BLE001 - counted by case_failed; the bench exits 1 after its table
            case_failed(what, e)
            rows.append(f"| {what} | failed: {type(e).__name__}: {str(e)[:80]} | – | – |")
    title = f"batch-1 decode MoE in one launch, E {args.experts}, {args.layers} copies, "
    print_table(
        title + torch.cuda.get_device_name(),
        ["kernels", "µs a call", "share of a copy", "against the engine"],
        rows,
    )
    if report():
        sys.exit(1)


if __name__ == "__main__":
    main()

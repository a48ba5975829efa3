"""Where batch 1's decode MoE GEMMs spend their time: the engine's split-K gate_up and down beside
moe_ablate's copies of them with parts taken away (the dequant; the dequant and the dot) and with
each program's K steps split over more programs, as CUDA-graph replays (timing.graph_us).

    python3 bench/kernels/moe_ablate_gpu.py [--experts 32] [--layers 24] [--kparts 1,2,3,4] [--stages 2,6]
        [--modes full,nodeq,dequant,loads] [--gu-tiles BN,BK,SPLIT,STAGES;..] [--dn-tiles ..]

LAYERS distinct copies of the experts, one a call in turn, so every call reads its weights from HBM.
One token, bf16, H = I = 2880 (20b and 120b alike), top-4 on distinct experts. Rows: µs a call, the
share of the copy bandwidth (hbm.share) on the bytes read (words and scales of 4 experts), and the
time against the engine's kernel for the same GEMM. How to read it: if "loads" is near the engine's
time, the copies' structure (bytes in flight, the chain of K steps) holds it; if far below, the
instructions after them do, and "nodeq" says how much of that is the dequant.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import hbm  # noqa: E402
import moe_ablate  # noqa: E402
from timing import case_failed, graph_us, print_table, report  # noqa: E402

from gptoss.kernels import moe_v3_dec, moe_v3_dec_gu  # noqa: E402
from gptoss.kernels.moe_routing import Routing  # noqa: E402
from gptoss.kernels.moe_tiles import DecTiles  # noqa: E402
from tests.gptoss.kernels.moekit import ALPHA, LIMIT, make_moe  # noqa: E402

H = I = 2880
K = 4


def _tiles(spec: str) -> list[DecTiles]:
    """ "BN,BK,SPLIT,STAGES;..." -> one-token tiles (BM 1, warps = SPLIT)."""
    out = []
    for item in filter(None, spec.split(";")):
        bn, bk, split, stages = map(int, item.split(","))
        out.append(DecTiles(1, bn, bk, split, split, stages))
    return out


def batch1_cases(experts: int, n_layers: int) -> tuple[list, Callable, dict, dict]:
    """Batch 1's two decode GEMMs as these benches time them: n_layers weight copies (w, x, logits, ids)
    read in turn by layer(), and for "gate_up" / "down" (tiles, MB read, K, the GEMM's words of w, its
    x) and the engine's kernel (a call)."""
    layers = []
    for seed in range(n_layers):
        ref, w = make_moe(experts, H, I, K, torch.bfloat16, seed=seed, kernels="v3")
        x = torch.randn(1, H, device="cuda", dtype=torch.bfloat16)
        logits = F.linear(x, ref.router_weight, ref.router_bias).contiguous()
        ids = torch.randperm(experts, device="cuda")[:K].to(torch.int32)
        layers.append((w, x, logits, ids))
        del ref
    r = Routing.empty(1, K, experts, torch.device("cuda"))
    act = torch.randn(K, I, device="cuda", dtype=torch.bfloat16)
    a1 = act[:1].contiguous()
    layer = itertools.cycle(layers).__next__  # the next copy a call: each read from HBM

    gu_t = moe_v3_dec.dec_tiles_v3(1, H, moe_v3_dec_gu.V3_GATE_UP_DEC)
    dn_t = moe_v3_dec.dec_tiles_v3(1, I)
    down_mb = K * H * (I // 2 + I // 32) / 1e6
    gemms = {
        "gate_up": (gu_t, 2 * down_mb, H, lambda w: (w.w13, w.s13), lambda x: x),
        "down": (dn_t, down_mb, I, lambda w: (w.w2, w.s2), lambda x: a1),
    }

    def gate_up():
        w, x, logits, _ = layer()
        return moe_v3_dec_gu.gate_up_v3_dec(x, r, w, ALPHA, LIMIT, logits=logits)

    engine = {"gate_up": gate_up, "down": lambda: moe_v3_dec.down_v3_dec(act, r, layer()[0])}
    return layers, layer, gemms, engine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--kparts", default="1,2,3,4")
    ap.add_argument("--stages", default="", help="extra stage counts for the kparts-1 rows, e.g. 2,6")
    ap.add_argument("--modes", default="full,nodeq,dequant,loads")
    ap.add_argument("--gu-tiles", default="", help="more gate_up tiles, BN,BK,SPLIT,STAGES;.. (full, loads)")
    ap.add_argument("--dn-tiles", default="", help="more down tiles, as --gu-tiles")
    args = ap.parse_args()
    kparts = [int(p) for p in args.kparts.split(",")]
    stages = [int(s) for s in args.stages.split(",") if s]
    layers, layer, gemms, engine = batch1_cases(args.experts, args.layers)
    r = Routing.empty(1, K, args.experts, torch.device("cuda"))
    down_mb = gemms["down"][1]
    rows: list[str] = []
    extra = {"gate_up": _tiles(args.gu_tiles), "down": _tiles(args.dn_tiles)}
    for name, (tiles, mb, k, words, xin) in gemms.items():
        base = graph_us(engine[name], args.layers)
        rows.append(
            f"| {name} | engine {tiles} | {base:.2f} | {hbm.share(mb * 1e6, base) * 100:.1f} % | 1.00 |"
        )
        cases = [(tiles, m, p, None) for m in args.modes.split(",") for p in kparts]
        cases += [(tiles, m, 1, s) for m in ("full", "loads") for s in stages]
        cases += [(t, m, 1, None) for t in extra[name] for m in ("full", "loads")]
        for t, mode, p, st in cases:

            def call(t=t, mode=mode, p=p, st=st, k=k, words=words, xin=xin):
                w, x, _, ids = layer()
                return moe_ablate.ablate(xin(x), ids, *words(w), k, t, mode, p, st)

            what = f"{mode} kparts {p}" + (f" stages {st}" if st else "")
            if t is not tiles:
                what += f" BN {t.bn} BK {t.bk} split {t.split} stages {t.stages}"
            try:
                us = graph_us(call, args.layers)
            except Exception as e:  # noqa: BLE001 - counted by case_failed; the bench exits 1 after its table
                case_failed(f"{name} {what}", e)
                rows.append(f"| {name} | {what} | failed: {type(e).__name__} | – | – |")
                continue
            share = hbm.share(mb * 1e6, us) * 100
            rows.append(f"| {name} | {what} | {us:.2f} | {share:.1f} % | {us / base:.2f} |")
            print(rows[-1], file=sys.stderr, flush=True)  # partial results survive a lost run

    def both():
        w, x, logits, _ = layer()
        return moe_v3_dec.down_v3_dec(
            moe_v3_dec_gu.gate_up_v3_dec(x, r, w, ALPHA, LIMIT, logits=logits), r, w
        )

    us = graph_us(both, args.layers)
    rows.append(
        f"| both | engine gate_up + down | {us:.2f} | {hbm.share(3 * down_mb * 1e6, us) * 100:.1f} % | – |"
    )
    title = f"batch-1 decode MoE GEMMs taken apart, E {args.experts}, {args.layers} weight copies, bf16, "
    print_table(
        title + torch.cuda.get_device_name(),
        ["GEMM", "kernel", "µs a call", "share of a copy", "against the engine"],
        rows,
    )
    if report():
        sys.exit(1)


if __name__ == "__main__":
    main()

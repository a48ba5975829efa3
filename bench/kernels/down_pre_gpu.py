"""Batch 1's preloading down (moe_v3_down_pre) against the split-K decode down, alone and after the
gate_up as the engine runs them, as CUDA-graph replays (bench/kernels/timing.graph_us).

    python3 bench/kernels/down_pre_gpu.py [--experts 32] [--layers 24] [--tiles 16,4 32,8]

LAYERS distinct copies of the experts, one a call in turn, so each call reads its weights from HBM
(a token's 4 experts of 24 layers: 1.3 GB against 50 MB of L2). One token, bf16, H = I = 2880,
top-4, random weights. Rows: the down alone, then gate_up + down (the gate_up releasing the
preloading down early), µs a call and the share of a 4.3 TB/s copy on the bytes read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.kernels.timing import graph_us  # noqa: E402
from gptoss.kernels import moe_v3_dec, moe_v3_dec_gu, moe_v3_down_pre  # noqa: E402
from gptoss.kernels.moe_routing import Routing  # noqa: E402
from tests.gptoss.kernels.moekit import ALPHA, LIMIT, make_moe  # noqa: E402

COPY_TBS = 4.3  # a device-to-device copy on an H200 (bench/results v46)
H = I = 2880
K = 4


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--tiles", nargs="+", default=["16,4", "32,8"])
    args = ap.parse_args()
    tiles = [moe_v3_down_pre.tile_from_env(t) for t in args.tiles]
    layers = []
    for seed in range(args.layers):
        ref, w = make_moe(args.experts, H, I, K, torch.bfloat16, seed=seed, kernels="v3")
        x = torch.randn(1, H, device="cuda", dtype=torch.bfloat16)
        logits = F.linear(x, ref.router_weight, ref.router_bias).contiguous()
        layers.append((w, x, logits))
        del ref
    r = Routing.empty(1, K, args.experts, torch.device("cuda"))
    act = torch.randn(K, I, device="cuda", dtype=torch.bfloat16)
    turn = [0]

    def layer():
        turn[0] = (turn[0] + 1) % len(layers)
        return layers[turn[0]]

    def gate_up(release: bool):
        w, x, logits = layer()
        return w, logits, moe_v3_dec_gu.gate_up_v3_dec(x, r, w, ALPHA, LIMIT, logits=logits, release=release)

    w0, x0, l0 = layers[0]
    a0 = moe_v3_dec_gu.gate_up_v3_dec(x0, r, w0, ALPHA, LIMIT, logits=l0)
    want = moe_v3_dec.down_v3_dec(a0, r, w0)
    down_mb = K * H * (I // 2 + I // 32) / 1e6
    gu_mb = 2 * down_mb
    rows = []

    def row(name: str, us: float, mb: float) -> None:
        rows.append(f"| {name} | {us:.2f} | {mb / us / COPY_TBS * 100:.1f} % |")

    row(
        "split-K down alone",
        graph_us(lambda: moe_v3_dec.down_v3_dec(act, r, layer()[0]), args.layers),
        down_mb,
    )
    for t in tiles:
        got = moe_v3_down_pre.down_v3_pre(a0, r, w0, l0, t)
        err = ((got.double() - want.double()).norm() / want.double().norm()).item()
        print(f"preload {t}: relative error against the split-K down {err:.2e}")

        def pre(t=t):
            w, _, logits = layer()
            return moe_v3_down_pre.down_v3_pre(act, r, w, logits, t)

        row(f"preload down {t} alone", graph_us(pre, args.layers), down_mb)
    row("gate_up alone", graph_us(lambda: gate_up(False), args.layers), gu_mb)

    def both_split():
        w, _, a = gate_up(False)
        return moe_v3_dec.down_v3_dec(a, r, w)

    row("gate_up + split-K down", graph_us(both_split, args.layers), gu_mb + down_mb)
    for t in tiles:

        def both_pre(t=t):
            w, logits, a = gate_up(True)
            return moe_v3_down_pre.down_v3_pre(a, r, w, logits, t)

        row(f"gate_up (release) + preload down {t}", graph_us(both_pre, args.layers), gu_mb + down_mb)
    print(f"\n20b-like MoE at one token, E {args.experts}, {args.layers} weight copies, bf16\n")
    print("| kernels | µs a call | share of a copy |\n|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()

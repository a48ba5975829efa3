"""Batch-1 decode attention as a decode step runs it: a chain of layers in one CUDA graph, PDL on,
µs a layer, under module switches (CUDA only).

    python bench/kernels/attn_chain_gpu.py [--ctx 128,640,2000] [--layers 36] [--replays 50] \
        [--variant NAME=attention.ATTR=VALUE[+...] ...]

Why: in the engine, 120b's attention adds ~11 µs a layer at batch 1 (bench/results v37) while it
moves ~1 MB: its cost is its chain of dependent steps after the PDL wait, not bytes. The engine A/B
(decode_ab_gpu.py) measures a variant in a whole step; this measures attention alone, and beside the
projections around it, in seconds of device time and without a checkpoint.

gpt-oss-120b's attention shapes: 64 query heads over 8 KV heads of 64, 16-token blocks, sinks, RoPE
and the KV write inside attention (the engine's decode default), sliding (128-key ring) and full
layers alternating, the full ones under a 4096-key bound (the engine's max_model_len, whose splits
follow it, not the context). Each layer has its own KV cache and projection weights, so the weights
stream from DRAM as in a step. Two chains a variant and context:
- attn: the layers' attention launches alone, back to back;
- proj: QKV GEMV -> attention -> O GEMV a layer, the O output feeding the next QKV (gemv_preload, the
  batch-1 projections); "attn in proj" is that chain less the projections alone (QKV -> O).
Variants as decode_ab_gpu.py takes them (its parser and switches); NAME= runs the defaults.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from decode_ab_gpu import Switches, parse_variant  # noqa: E402

sys.path.insert(0, str(REPO / "bench" / "kernels"))
from moe_gpu import _capture  # noqa: E402

from gptoss.kernels import attention  # noqa: E402
from gptoss.kernels.gemv_preload import gemv_preload  # noqa: E402

HQ, HKV, D, BS, WINDOW, HIDDEN, BOUND = 64, 8, 64, 16, 128, 2880, 4096
DEFAULT_VARIANTS = [
    "base=attention.LIVE_SPLITS=False",
    "live=",
    "w64=attention.SMALL_DECODE_CFG=(64,4,2)+attention.SMALL_SPLIT_KEYS=64",
    "w64w2=attention.SMALL_DECODE_CFG=(64,2,2)+attention.SMALL_SPLIT_KEYS=64",
    "w128=attention.SMALL_DECODE_CFG=(128,4,2)+attention.SMALL_SPLIT_KEYS=128",
    "w128w8=attention.SMALL_DECODE_CFG=(128,8,2)+attention.SMALL_SPLIT_KEYS=128",
    "w256w8=attention.SMALL_DECODE_CFG=(256,8,1)+attention.SMALL_SPLIT_KEYS=256",
]


class Layer:
    """One layer's operands: its projections, KV cache and table, and the step's RoPE inputs."""

    def __init__(self, i: int, ctx: int, dev: torch.device, g: torch.Generator):
        self.sliding = i % 2 == 0
        bf = torch.bfloat16
        self.wqkv = torch.randn(HQ * D + 2 * HKV * D, HIDDEN, device=dev, dtype=bf, generator=g) * 0.02
        self.bqkv = torch.randn(HQ * D + 2 * HKV * D, device=dev, dtype=bf, generator=g) * 0.02
        self.wo = torch.randn(HIDDEN, HQ * D, device=dev, dtype=bf, generator=g) * 0.02
        self.bo = torch.randn(HIDDEN, device=dev, dtype=bf, generator=g) * 0.02
        blocks = WINDOW // BS if self.sliding else -(-BOUND // BS)
        self.kc = torch.randn(blocks + 1, BS, HKV, D, device=dev, dtype=bf, generator=g)
        self.vc = torch.randn_like(self.kc)
        self.table = torch.randperm(blocks, device=dev, generator=g).to(torch.int32)[None, :]
        self.sinks = torch.randn(HQ, device=dev, generator=g)
        ring = ctx // BS % blocks if self.sliding else ctx // BS
        self.slot = (self.table[0, ring].long() * BS + ctx % BS).view(1)


def attend(lay: Layer, qkv: torch.Tensor, meta: dict) -> torch.Tensor:
    q = qkv[:, : HQ * D].view(1, HQ, D)
    k = qkv[:, HQ * D : HQ * D + HKV * D].view(1, HKV, D)
    v = qkv[:, HQ * D + HKV * D :].view(1, HKV, D)
    return attention.paged_attention(
        q,
        k,
        v,
        lay.kc,
        lay.vc,
        lay.table,
        meta["qs"],
        meta["ctx"],
        lay.sinks,
        D**-0.5,
        WINDOW if lay.sliding else None,
        WINDOW // BS if lay.sliding else None,
        1,
        out=meta["out"],
        max_context_hint=BOUND,
        rope=(meta["pos"], meta["cos_sin"], lay.slot),
    )


def chain(layers: list[Layer], x: torch.Tensor, meta: dict, kind: str) -> None:
    """One decode step's layers: attn (attention alone), proj (QKV -> attention -> O), gemv (QKV -> O)."""
    for lay in layers:
        if kind == "attn":
            attend(lay, meta["qkv"], meta)
            continue
        qkv = gemv_preload(x, lay.wqkv, lay.bqkv)
        o_in = attend(lay, qkv, meta).view(1, HQ * D) if kind == "proj" else qkv[:, : HQ * D]
        x = gemv_preload(o_in, lay.wo, lay.bo)


def time_graph(fn, replays: int) -> float:
    """µs a replay of fn captured in a CUDA graph (moe_gpu's capture: an eager run that compiles and
    makes the tickets, then a side-stream warm-up), median of `replays` event-timed replays."""
    replay = _capture(fn)
    for _ in range(5):
        replay()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000)
    return sorted(times)[len(times) // 2]


def measure(ctx: int, args: argparse.Namespace, variants: dict, switches: Switches) -> list[tuple]:
    """Rows (ctx, variant, attn alone, QKV+attn+O, attn in proj, QKV+O), µs a layer, at one context."""
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(ctx)
    layers = [Layer(i, ctx, dev, g) for i in range(args.layers)]
    meta = dict(
        qs=torch.tensor([0, 1], dtype=torch.int32, device=dev),
        ctx=torch.tensor([ctx], dtype=torch.int32, device=dev),
        pos=torch.tensor([ctx], dtype=torch.int64, device=dev),
        cos_sin=torch.randn(BOUND, D, device=dev, generator=g),
        out=torch.empty(1, HQ, D, dtype=torch.bfloat16, device=dev),
        qkv=torch.randn(1, HQ * D + 2 * HKV * D, dtype=torch.bfloat16, device=dev, generator=g),
    )
    x = torch.randn(1, HIDDEN, dtype=torch.bfloat16, device=dev, generator=g)
    n = args.layers
    switches.apply([])
    gemv = time_graph(functools.partial(chain, layers, x, meta, "gemv"), args.replays) / n
    rows = []
    for name, sets in variants.items():
        switches.apply(sets)
        attn = time_graph(functools.partial(chain, layers, x, meta, "attn"), args.replays) / n
        proj = time_graph(functools.partial(chain, layers, x, meta, "proj"), args.replays) / n
        rows.append((ctx, name, attn, proj, proj - gemv, gemv))
        print(f"ctx {ctx} {name}: attn {attn:.2f} us a layer, proj chain {proj:.2f}", flush=True)
    switches.apply([])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ctx", default="128,640,2000", help="cached keys of the sequence, comma-separated")
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--variant", action="append", help="NAME=[MOD.ATTR=VALUE[+...]] (default: a set)")
    args = ap.parse_args()
    variants = dict(map(parse_variant, args.variant or DEFAULT_VARIANTS))
    switches = Switches(variants)
    attention.reserve_tickets(torch.device("cuda"))
    rows = []
    for ctx in map(int, args.ctx.split(",")):
        rows += measure(ctx, args, variants, switches)
        torch.cuda.empty_cache()
    print(
        f"\n{'ctx':>5} {'variant':10} {'attn alone':>11} {'QKV+attn+O':>11} {'attn in proj':>13} {'QKV+O':>7}"
    )
    for ctx, name, attn, proj, added, gemv in rows:
        print(f"{ctx:5d} {name:10} {attn:11.2f} {proj:11.2f} {added:13.2f} {gemv:7.2f}")
    print("(µs a layer, median of the graph's replays; layers alternate sliding and full)")


if __name__ == "__main__":
    main()

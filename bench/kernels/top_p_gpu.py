"""The top-p search's pass tiles against each other and against the vocabulary sort, on one GPU.

    python bench/kernels/top_p_gpu.py [--batch 1,64,256,1024] [--tiles 256x1x4,256x2x4,512x1x8]

A tile is sampling_top_p.PASS_TILE's BLOCKxUNROLLxWARPS. Per batch size B (rows of [B, 201,088]
float32 logits, randn * 3, top_p 0.9, temperature 1): the sort's masked copy (mask_top_k_top_p, one
call) is the peer; then for each tile top_p_cut alone (the search) and with the draw that applies the
cut (the engine's path with sampling.USE_CUT). `same` counts the rows whose (tau, cut) equal the first
tile's (another BLOCK adds a chunk's masses in another order, so a row on a float32 boundary may keep
one token more or less), `pass GB/s` is what the search's reads reach (10 reads of the row). Times are
CUDA-graph replays (timing.py), µs a call. One table last.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import timed_us  # noqa: E402

from gptoss.config import PRESETS  # noqa: E402
from gptoss.kernels import sampling_top_p  # noqa: E402
from gptoss.kernels.sampling_draw import gumbel_argmax  # noqa: E402
from gptoss.kernels.sampling_filter import mask_top_k_top_p  # noqa: E402

V = PRESETS["20b"].vocab_size


def parse_tiles(text: str) -> list[tuple[int, int, int]]:
    """'256x1x4,512x2x8' -> [(256, 1, 4), (512, 2, 8)]: BLOCK a power of two, UNROLL 1 or 2, WARPS
    1-16."""
    tiles = []
    for item in text.split(","):
        try:
            block, unroll, warps = (int(x) for x in item.split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item!r}: expected BLOCKxUNROLLxWARPS, e.g. 256x1x4") from None
        if block < 16 or block & (block - 1) or unroll not in (1, 2) or not 1 <= warps <= 16:
            raise argparse.ArgumentTypeError(
                f"{item!r}: BLOCK a power of two >= 16, UNROLL 1 or 2, WARPS 1-16"
            )
        tiles.append((block, unroll, warps))
    return tiles


def batch_rows(b: int, tiles: list[tuple[int, int, int]], device: str = "cuda", vocab: int = V) -> list[str]:
    """The table's rows at batch b (device and vocab: a CPU test runs them small, untimed)."""
    g = torch.Generator(device=device).manual_seed(b)
    logits = torch.randn(b, vocab, device=device, generator=g) * 3
    ones = torch.ones(b, device=device)
    top_p = torch.full((b,), 0.9, device=device)
    no_k = torch.zeros(b, dtype=torch.int32, device=device)
    seeds, offsets = torch.arange(b, device=device), torch.zeros(b, dtype=torch.int64, device=device)
    sort_us = timed_us(
        lambda: gumbel_argmax(mask_top_k_top_p(logits, ones, no_k, top_p), ones, seeds, offsets),
        f"B={b} sort",
    )
    rows = [f"{b:5} sort (masked copy) + draw {'':14} {sort_us:9.1f} {'-':>9} {'':>6} {'1.00':>6}"]
    first = None
    for tile in tiles:
        sampling_top_p.PASS_TILE = tile
        cut = sampling_top_p.top_p_cut(logits, ones, top_p)
        first = first or cut
        same = int(((cut[0] == first[0]) & (cut[1] == first[1])).sum())
        search = timed_us(lambda: sampling_top_p.top_p_cut(logits, ones, top_p), f"B={b} {tile} search")
        both = timed_us(
            lambda: gumbel_argmax(
                logits, ones, seeds, offsets, sampling_top_p.top_p_cut(logits, ones, top_p)
            ),
            f"B={b} {tile} search + draw",
        )
        gbs = 10 * b * vocab * 4 / (search * 1e-6) / 1e9
        name = "x".join(map(str, tile))
        rows.append(
            f"{b:5} search {name:12} + draw {same:4}/{b:<5} {both:9.1f} {search:9.1f} {gbs:6.0f} "
            f"{sort_us / both:6.2f}"
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", default="1,64,256,1024")
    ap.add_argument("--tiles", type=parse_tiles, default=parse_tiles("256x1x4,256x2x4,512x1x8"))
    args = ap.parse_args()
    default = sampling_top_p.PASS_TILE
    rows = []
    for b in (int(x) for x in args.batch.split(",")):
        rows += batch_rows(b, args.tiles)
        print("\n".join(rows[-len(args.tiles) - 1 :]), flush=True)
    sampling_top_p.PASS_TILE = default
    print(f"\ntop-p 0.9 over [B, {V}] float32, {torch.cuda.get_device_name()}; µs a call")
    print(f"{'B':>5} {'path':30} {'same':>10} {'+ draw':>9} {'search':>9} {'GB/s':>6} {'×sort':>6}")
    print("\n".join(rows))


if __name__ == "__main__":
    main()

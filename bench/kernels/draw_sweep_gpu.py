"""The unfiltered draw's launch shape: sampling_draw.SCREEN x CHUNK_MAX x (BLOCK, warps), timed against
the default launch (screened from SCREEN_FROM rows, in SCREEN_*'s shape) in the same run, on float32
and bf16 logits (randn x 3, the ops rows' draw). A variant's SCREEN and shape apply at every batch
size, screened or not.

    python bench/kernels/draw_sweep_gpu.py [--batch 64,256,1024] [--chunks 16384,65536] [--shapes 1024x4]

Why: v69 found the screen (SCREEN 1) 1.14x at B 1024 where its instruction counts promised ~1.7x.
At steps of 1,024 on 4 warps each screened step ends in a block-wide reduction (6 BAR.SYNC in the
sm_90a loop) and, at chunks of 16,384, 16 steps a program give the screen a short history (18 % of a
random row's elements take the logs in the interpreter). One warp on steps of 256 has no barrier in
its loop and 64 steps a chunk (6.4 %; 2.4 % at chunks of 65,536), ~47 instructions an element
against ~58 (bench/results v69). v70 (H200) swept it and adopted 256 x 1 at chunks of 8,192 for
screened launches (sampling_draw.SCREEN_*). Each variant's ids are checked against the
default's (the same draw bit for bit), and a variant that differs is a failed case (exit 1). Times are
CUDA-graph replays (timing.graph_us), µs a call; ratio = default / variant (> 1: the variant is faster).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ops_gpu import switched  # noqa: E402
from timing import case_failed, report, timed_us  # noqa: E402

from gptoss.config import PRESETS
from gptoss.kernels import sampling_draw
from gptoss.kernels.sampling_draw import gumbel_argmax

KNOBS = ("SCREEN", "CHUNK_MAX", "_BLOCK", "WARPS")
SCREENED = {"CHUNK_MAX": "SCREEN_CHUNK_MAX", "_BLOCK": "SCREEN_BLOCK", "WARPS": "SCREEN_WARPS"}


def ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def shapes(text: str) -> list[tuple[int, int]]:
    """'1024x4,2048x8' -> [(BLOCK, warps), ...]"""
    return [tuple(int(v) for v in s.split("x")) for s in text.split(",") if s]  # type: ignore[misc]


def with_knobs(values: tuple[int, ...], fn: Callable[[], torch.Tensor]) -> torch.Tensor:
    """fn() with sampling_draw's knobs set to values (the shape screened launches and the others take
    alike) and SCREEN applying at every batch size (SCREEN_FROM 1), then put back (a graph capture runs
    fn too)."""
    knobs = dict(zip(KNOBS, values, strict=True))
    knobs |= {SCREENED[k]: v for k, v in knobs.items() if k in SCREENED}
    return switched(fn, sampling_draw, **knobs, SCREEN_FROM=1)()


def sweep(
    batches: list[int],
    screens: list[int],
    chunks: list[int],
    blocks: list[tuple[int, int]],
    vocab: int,
    device: str,
    time_us: Callable[[Callable[[], object], str], float] = timed_us,
) -> list[dict]:
    """One row a (batch, dtype, variant): its µs, the default's, and whether its ids equal the default's."""
    rows = []
    for b, dtype in itertools.product(batches, (torch.float32, torch.bfloat16)):
        g = torch.Generator(device).manual_seed(b)
        logits = (torch.randn(b, vocab, device=device, generator=g) * 3).to(dtype)
        ones = torch.ones(b, device=device)
        seeds, offsets = torch.arange(b, device=device), torch.full((b,), 1000, device=device)

        def draw() -> torch.Tensor:
            return gumbel_argmax(logits, ones, seeds, offsets)  # noqa: B023 (called in this iteration)

        name = f"B={b} {str(dtype).removeprefix('torch.')}"
        want = draw()
        base = time_us(draw, f"{name} default")
        for screen, chunk, (block, warps) in itertools.product(screens, chunks, blocks):
            values = (screen, chunk, block, warps)
            what = f"{name} screen {screen} chunk {chunk} block {block}x{warps}"
            same = bool(torch.equal(with_knobs(values, draw), want))
            if not same:
                case_failed(what, "ids differ from the default launch's")
            us = time_us(lambda v=values: with_knobs(v, draw), what)
            rows.append(
                dict(
                    case=name,
                    screen=screen,
                    chunk=chunk,
                    block=block,
                    warps=warps,
                    us=us,
                    base=base,
                    same=same,
                )
            )
    return rows


def table(rows: list[dict]) -> str:
    head = f"{'case':<14} {'screen':>6} {'chunk':>7} {'block':>9} {'us':>9} {'default':>9} {'ratio':>6}  ids"
    lines = [head]
    for r in rows:
        shape = f"{r['block']}x{r['warps']}"
        lines.append(
            f"{r['case']:<14} {r['screen']:>6} {r['chunk']:>7} {shape:>9} {r['us']:>9.1f} {r['base']:>9.1f} "
            f"{r['base'] / r['us']:>6.2f}  {'same' if r['same'] else 'DIFFER'}"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=ints, default=[64, 256, 1024])
    ap.add_argument("--screens", type=ints, default=[0, 1])
    ap.add_argument("--chunks", type=ints, default=[16384, 65536, 262144])
    ap.add_argument(
        "--shapes", type=shapes, default=[(1024, 4), (512, 2), (256, 1), (2048, 8)], help="BLOCKxWARPS list"
    )
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("draw_sweep_gpu.py needs a CUDA device")
    rows = sweep(args.batch, args.screens, args.chunks, args.shapes, PRESETS["20b"].vocab_size, "cuda")
    print(table(rows))
    sys.exit(1 if report() else 0)


if __name__ == "__main__":
    main()

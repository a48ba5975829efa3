"""How Triton's compile scales over threads on this machine's CPU (gptoss.precompile compiles on
threads while the checkpoint loads): the same distinct v3 MoE specializations for sm_90a (no GPU
needed), into an empty cache each time, one after another and then on N threads.

    python bench/compile_threads.py [--threads 1,4,8,15] [--kernels 24]

Why: Triton's MLIR passes, LLVM and ptxas run outside the GIL, its Python code generation does not.
Two threads on a 2-core CPU compiled four tiles in 1.48 s against 3.13 s; whether fifteen gain
fifteen-fold is what the start-up's overlap with loading depends on. One table last.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "kernels"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import moe_v3_sass  # noqa: E402
from triton import knobs  # noqa: E402

from gptoss.kernels.moe_tiles import Tiles  # noqa: E402


def jobs(n: int) -> list[tuple[str, Tiles, bool]]:
    """n distinct (gemm, tiles, weights by TMA) specializations."""
    shapes = itertools.product(
        ("gate_up", "down"), (16, 32, 64), (32, 64, 128), (64, 128), (4, 8), (2, 3), (False, True)
    )
    out = []
    for gemm, bm, bn, bk, warps, stages, wtma in shapes:
        if bn * bk * stages > 2 * 128 * 128:  # keep shared memory in range
            continue
        out.append((gemm, Tiles(bm, bn, bk, warps, stages), wtma))
    return out[:n]


def compile_one(job: tuple[str, Tiles, bool]) -> float:
    gemm, t, wtma = job
    t0 = time.perf_counter()
    getattr(moe_v3_sass, gemm)(t, wtma)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,4,8,15")
    ap.add_argument("--kernels", type=int, default=24)
    args = ap.parse_args()
    work = jobs(args.kernels)
    compile_one(work[-1])  # imports and first-use costs outside the timings (its own cache)
    rows = []
    for n in map(int, args.threads.split(",")):
        knobs.cache.dir = tempfile.mkdtemp(prefix=f"tc{n}-")
        t0 = time.perf_counter()
        with ThreadPoolExecutor(n) as ex:
            each = list(ex.map(compile_one, work[:-1]))
        wall = time.perf_counter() - t0
        rows.append((n, len(each), wall, sum(each)))
        print(f"threads {n}: {len(each)} kernels in {wall:.2f} s", flush=True)
    base = rows[0][2]
    print(f"\ncpus {len(os.sched_getaffinity(0))}")
    print(f"{'threads':>8} {'kernels':>8} {'wall s':>8} {'sum of each s':>14} {'speed-up':>9}")
    for n, k, wall, total in rows:
        print(f"{n:>8} {k:>8} {wall:>8.2f} {total:>14.2f} {base / wall:>8.2f}x")


if __name__ == "__main__":
    main()

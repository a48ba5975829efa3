"""Peak temporary memory of the top-k / top-p filters, in bytes a logit, on CPU.

    python bench/sampling_memory.py [--rows 64] [--vocab 201088]

Why: sampling.SORT_ROWS sizes the vocabulary sort's blocks from this figure (the sort's temporaries
must fit in what model_runner.step_workspace_bytes keeps). torch.profiler's memory events on CPU,
each op's own allocations and frees in time order, give the running peak above the inputs; a GPU's
radix sort adds its own buffers on top. One row a filter path: mask_top_k_top_p (the sort) with top_p
alone and with top_k, and mask_within_top_k (a per-row top-k).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gptoss.kernels.sampling_filter import mask_top_k_top_p, mask_within_top_k  # noqa: E402


def peak_bytes(fn) -> int:
    """The running peak of fn's own allocations, from the profiler's memory events in time order."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    cur = peak = 0
    for e in sorted(prof.events(), key=lambda e: e.time_range.start):
        cur += e.self_cpu_memory_usage
        peak = max(peak, cur)
    return peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=201088)
    args = ap.parse_args()
    b, v = args.rows, args.vocab
    x = torch.randn(b, v, generator=torch.Generator().manual_seed(0)) * 3
    t, p = torch.ones(b), torch.full((b,), 0.9)
    k0, k50 = torch.zeros(b, dtype=torch.int32), torch.full((b,), 50, dtype=torch.int32)
    paths = {
        "sort, top_p 0.9": lambda: mask_top_k_top_p(x, t, k0, p),
        "sort, top_k 50 + top_p 0.9": lambda: mask_top_k_top_p(x, t, k50, p),
        "per-row top-k, top_k 50 + top_p 0.9": lambda: mask_within_top_k(x, t, k50, p, 50),
    }
    print(f"[{b}, {v}] float32 logits, CPU; peak temporaries (the masked copy included)")
    print(f"{'filter':40} {'bytes a logit':>14} {'GB at 1024 rows':>16}")
    for name, fn in paths.items():
        per = peak_bytes(fn) / (b * v)
        print(f"{name:40} {per:14.1f} {per * 1024 * v / 1e9:16.2f}")


if __name__ == "__main__":
    main()

"""What a pure streaming read of a decode MoE GEMM's bytes reaches on this GPU: the ceiling that issue
10's "80 % of HBM bandwidth at M <= 16" is measured against.

    python bench/kernels/read_ceiling_gpu.py [--mbytes 17.6,35.2] [--calls 16]

Each case reads `mbytes` MB once a call, in a CUDA graph of `calls` calls over as many distinct
buffers (so every call reads from HBM: the buffers together are many times the 50 MB L2), and prints
the GPU time a call, the bytes a microsecond and the share of the copy bandwidth (hbm.share). The rows:
- read BLOCKxUNROLL wW gG: a Triton kernel whose G programs (G/SMs waves; 1 = one a SM) of W warps
  each stream int32 words, UNROLL independent BLOCK-word loads in flight before their XOR (the loads
  of a warp otherwise wait on each other), the XOR of all written so nothing is optimized away;
- read ..., read / zero flush: the last of those configurations, one call at a time on one buffer
  timed by timing.cold_us after L2 is emptied by reading or by zeroing 256 MB (the zeroed lines are
  dirty: written back to HBM while the read runs);
- copy: torch's device-to-device copy_ of the same bytes (read + written: 2x the bytes counted).
At T = 1 the 20b / 120b gate_up reads 4 experts x 8.8 MB = 35.2 MB a layer, the down 17.6 MB; 352 MB
is the steady state that the copy bandwidth (4.3 TB/s on an H200) describes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))

import hbm  # noqa: E402
from timing import FLUSHES, cold_us, graph_us  # noqa: E402


@triton.jit
def _read_kernel(x_ptr, out_ptr, n_words, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    acc = tl.zeros([BLOCK], tl.int32)
    step = BLOCK * UNROLL
    for base in range(pid * step, n_words, nprog * step):
        for u in tl.static_range(UNROLL):  # UNROLL loads issued before the first XOR waits
            offs = base + u * BLOCK + tl.arange(0, BLOCK)
            acc ^= tl.load(x_ptr + offs, mask=offs < n_words, other=0, cache_modifier=".cg")
    tl.store(out_ptr + pid, tl.reduce(acc, 0, _xor))


@triton.jit
def _xor(a, b):
    return a ^ b


def _cycle(bufs: list[torch.Tensor], fn):
    """A call of fn on the next buffer each time (a graph capture of len(bufs) calls reads each once)."""
    state = {"i": 0}

    def call():
        b = bufs[state["i"] % len(bufs)]
        state["i"] += 1
        fn(b)

    return call


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mbytes", default="17.6,35.2,352", help="MB read a call, comma-separated")
    ap.add_argument("--calls", type=int, default=16, help="calls (distinct buffers) in the graph")
    args = ap.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name()}: {sms} SMs, copy {hbm.copy_bytes_per_s() / 1e12:.2f} TB/s")
    rows = []
    for mb in (float(m) for m in args.mbytes.split(",")):
        words = int(mb * 1e6) // 4
        bufs = [torch.randint(-(2**31), 2**31 - 1, (words,), dtype=torch.int32, device="cuda")]
        bufs += [torch.roll(bufs[0], i) for i in range(1, args.calls)]
        out = torch.empty(16 * sms, dtype=torch.int32, device="cuda")
        for block, unroll, warps, waves in [
            (1024, 4, 4, 1),
            (2048, 4, 8, 1),
            (1024, 4, 4, 2),
            (512, 4, 4, 4),
            (512, 8, 4, 4),
            (1024, 8, 8, 4),
            (512, 8, 4, 8),
            (256, 8, 4, 8),
            (256, 8, 4, 16),
            (256, 4, 2, 16),
        ]:
            grid = (waves * sms,)

            def read(b, block=block, unroll=unroll, warps=warps, grid=grid, out=out):
                _read_kernel[grid](b, out, b.numel(), BLOCK=block, UNROLL=unroll, num_warps=warps)

            us = graph_us(_cycle(bufs, read), calls=args.calls)
            rows.append((mb, f"read {block}x{unroll} w{warps} g{grid[0]}", us, mb * 1e6))
        # One read a call after L2 is emptied each of timing.l2_flush's two ways: what zeroing (the
        # MoE table's flush before v73, triton's do_bench) costs a read in write-backs.
        for flush in FLUSHES:
            us = cold_us(lambda b=bufs[0]: read(b), flush=flush)
            rows.append((mb, f"read {block}x{unroll} w{warps} g{grid[0]}, {flush} flush", us, mb * 1e6))
        dst = torch.empty_like(bufs[0])
        us = graph_us(_cycle(bufs, dst.copy_), calls=args.calls)
        rows.append((mb, "copy (read + write)", us, 2 * mb * 1e6))
        del bufs, dst
    print(f"\n{'MB':>6} {'case':<24} {'us':>8} {'GB/s':>8} {'copy share':>10}")
    for mb, case, us, nbytes in rows:
        print(f"{mb:6.1f} {case:<24} {us:8.2f} {nbytes / us / 1e3:8.0f} {hbm.share(nbytes, us):10.1%}")


if __name__ == "__main__":
    main()

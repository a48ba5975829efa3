"""Where the CTAs of a kernel launched with PDL land: SMs used and CTAs per SM, against a plain launch.

    python bench/kernels/pdl_placement.py [--ctas 360] [--warps 4] [--first-ctas 4] [--spin 20000]

Why (bench/results v36): at 120b batch 1 the gate_up that routes the logits took 726 µs a token
launched plainly and 1,322 with PDL (its programs placed while norm_logits runs), and the split-K
down 321 against 413 when gate_up let it be placed early. If the CTA scheduler packs a kernel that
is placed early onto few SMs (as many as fit on each), its programs share those SMs' issue slots and
memory pipes while the other SMs idle.

A small first kernel (--first-ctas CTAs, each spinning --spin dependent multiply-adds after its PDL
wait, as norm_logits runs while gate_up is placed) is followed by the probe: --ctas CTAs of --warps
warps that each record %smid, launched with and without PDL, inside a CUDA graph as the engine runs
them. Printed per mode: distinct SMs, most and fewest CTAs an SM (of those used), and the
histogram of CTAs per SM.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gptoss.kernels import pdl  # noqa: E402


@triton.jit
def _smid():
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _spin_kernel(out_ptr, spin, PDL: tl.constexpr):
    pdl.wait_then_release(PDL)
    x = tl.program_id(0).to(tl.float32)
    for _ in range(spin):  # a dependent chain: the kernel stays resident ~spin * 4 cycles
        x = x * 0.999 + 1.0
    tl.store(out_ptr + tl.program_id(0), x)


@triton.jit
def _probe_kernel(sm_ptr, PDL: tl.constexpr):
    pdl.wait_then_release(PDL)
    tl.store(sm_ptr + tl.program_id(0), _smid())


def placement(ctas: int, warps: int, first: int, spin: int, use_pdl: bool) -> Counter:
    sink = torch.zeros(first, device="cuda")
    sm = torch.full((ctas,), -1, dtype=torch.int32, device="cuda")
    kw = {"PDL": True, "launch_pdl": True} if use_pdl else {"PDL": False}

    def launch() -> None:
        _spin_kernel[(first,)](sink, spin, **kw, num_warps=4)
        _probe_kernel[(ctas,)](sm, **kw, num_warps=warps)

    launch()  # compile
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        launch()
    g.replay()
    torch.cuda.synchronize()
    return Counter(sm.tolist())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ctas", type=int, default=360)
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--first-ctas", type=int, default=4)
    ap.add_argument("--spin", type=int, default=20000)
    args = ap.parse_args()
    if not pdl.compiled_on_hopper(torch.empty(0, device="cuda")):
        raise SystemExit("needs a Hopper (or later) GPU: PDL")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{args.ctas} CTAs of {args.warps} warps after {args.first_ctas} spinning CTAs, {sms} SMs")
    for use_pdl in (False, True):
        c = placement(args.ctas, args.warps, args.first_ctas, args.spin, use_pdl)
        hist = sorted(Counter(c.values()).items())
        mode = "PDL" if use_pdl else "plain"
        print(
            f"  {mode:5}: {len(c)} SMs, CTAs an SM {min(c.values())}-{max(c.values())}; "
            f"histogram (CTAs: SMs) {dict(hist)}"
        )


if __name__ == "__main__":
    main()

"""Add + RMSNorm's warps a row against each other, torch, and vLLM's op where installed, on one GPU.

    python bench/kernels/rmsnorm_gpu.py [--t 1,64,256,512,1024,4096,8192] [--warps 16,8,4,2]

Per T (rows of H 2880 bf16 with a residual, the engine's ln1 / ln2 call): fused_add_rms_norm with
rmsnorm.LARGE_T = 1 and LARGE_WARPS = each of --warps (16: today's launch at every T), torch's add
then gptoss.model.rms_norm (the peer always there), and vLLM's in-place fused_add_rms_norm (bf16
weight) when vllm imports. `exact` counts the rows whose out equals the first --warps launch's bit for bit
(another warp count sums the squares in another order), `ulp` is the largest bf16 step between them.
Times are CUDA-graph replays (timing.py), µs a call. One table last.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import peer_failed, print_table, report, timed_us  # noqa: E402

from gptoss.config import PRESETS  # noqa: E402
from gptoss.kernels import rmsnorm  # noqa: E402
from gptoss.model import rms_norm  # noqa: E402

H = PRESETS["20b"].hidden_size


def parse_ints(text: str) -> list[int]:
    """'1,64,1024' -> [1, 64, 1024], each >= 1."""
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a comma list of integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every value must be >= 1")
    return values


def _vllm_ops():
    try:
        from vllm import _custom_ops
    except ImportError as e:
        peer_failed("vllm fused_add_rms_norm", f"not installed ({e})")
        return None
    return _custom_ops


def ulp_steps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[T, H] bf16 pair -> per-row largest distance in bf16 steps (the order of the bits, signed)."""

    def key(x: torch.Tensor) -> torch.Tensor:
        i = x.contiguous().view(torch.int16).to(torch.int32)
        return torch.where(i >= 0, i, -32768 - i)  # monotone in the value; -0.0 and +0.0 alike

    return (key(a) - key(b)).abs().amax(dim=1)


def t_rows(T: int, warps: list[int], vops, device: str = "cuda", hidden: int = H) -> list[str]:
    """The table's rows at T (device and hidden: a CPU test runs them small, untimed)."""
    g = torch.Generator(device=device).manual_seed(T)
    x = torch.randn(T, hidden, device=device, generator=g).bfloat16()
    res = torch.randn(T, hidden, device=device, generator=g).bfloat16()
    w = 1 + 0.1 * torch.randn(hidden, device=device, generator=g)
    torch_us = timed_us(lambda: rms_norm(res + x, w, 1e-5), f"T={T} torch")
    rows = []
    if vops is not None:
        xv, rv, wv = x.clone(), res.clone(), w.bfloat16()
        vllm_us = timed_us(partial(vops.fused_add_rms_norm, xv, rv, wv, 1e-5), f"T={T} vllm")
        rows.append(f"| {T} | vLLM (in place) | {vllm_us:.1f} | {torch_us / vllm_us:.2f} | | |")
    saved = rmsnorm.LARGE_T, rmsnorm.LARGE_WARPS
    first = None
    try:
        rmsnorm.LARGE_T = 1
        for n in warps:
            rmsnorm.LARGE_WARPS = n
            out, _ = rmsnorm.fused_add_rms_norm(x, res, w, 1e-5)
            first = out if first is None else first
            steps = ulp_steps(out, first)
            us = timed_us(partial(rmsnorm.fused_add_rms_norm, x, res, w, 1e-5), f"T={T} {n} warps")
            rows.append(
                f"| {T} | {rmsnorm.num_warps(T, triton.next_power_of_2(hidden))} warps | {us:.1f} | "
                f"{torch_us / us:.2f} | {int((steps == 0).sum())}/{T} | {int(steps.max())} |"
            )
    finally:
        rmsnorm.LARGE_T, rmsnorm.LARGE_WARPS = saved
    rows.append(f"| {T} | torch (add, rms_norm) | {torch_us:.1f} | 1.00 | | |")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--t", type=parse_ints, default=parse_ints("1,64,256,512,1024,4096,8192"))
    ap.add_argument("--warps", type=parse_ints, default=parse_ints("16,8,4,2"))
    args = ap.parse_args()
    vops = _vllm_ops()
    rows = []
    for T in args.t:
        rows += t_rows(T, args.warps, vops)
        print("\n".join(rows[-len(args.warps) - 1 - (vops is not None) :]), flush=True)
    print_table(
        f"add + RMSNorm, H {H} bf16 with a residual, {torch.cuda.get_device_name()}; µs a call "
        f"(×torch: torch's µs / this one's)",
        ["T", "launch", "µs", "×torch", "exact vs first", "max ulp"],
        rows,
    )
    return report()


if __name__ == "__main__":
    sys.exit(main())

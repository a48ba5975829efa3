"""The MoE's router and routing: moe_router's one launch against F.linear + route_and_group (cuBLAS's
GEMM, the counts' memset and the routing kernel), at gpt-oss's shapes (H 2880, top-4; E 32 and 128),
in the same run, over launch shapes BLOCK_T x BLOCK_K x warps x stages.

    python bench/kernels/router_gpu.py [--ts 65,256,1024,4096,16384] [--experts 32,128]
        [--shapes 16x64x4x3,32x64x4x3]
    python bench/kernels/router_gpu.py --record-specs MANIFEST   # the precompile's entries, in a new process

Why: at T 1,024 the unfused path took 10.2 µs for cuBLAS's split-K GEMM and reduce, 1.8 for the
memset and 6.4 for the routing launch (v64's Nsight Compute, H200), 18.4 of the 20b MoE's 637.9 µs
where it stood at 0.997x matmul_ogs. Every fused launch's decisions are checked exactly: with the
logits it stored, route_and_group gives the same ids, weights, counts and row lists (a launch that
does not is a failed case, exit 1); against F.linear's own logits the share of tokens routed alike is
printed (near ties may break the other way on a sum in another order). Times are CUDA-graph replays
(timing.timed_us), µs a call; ratio = unfused / fused (> 1: fused faster).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ops_gpu import switched  # noqa: E402
from timing import case_failed, print_table, report, timed_us  # noqa: E402

from gptoss.kernels import moe_router
from gptoss.kernels.moe_routing import route_and_group

H, TOP_K = 2880, 4
KNOBS = ("BLOCK_T", "BLOCK_K", "WARPS", "STAGES")


def ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def shapes(text: str) -> list[tuple[int, ...]]:
    """'16x64x4x3,32x64x4x3' -> [(BLOCK_T, BLOCK_K, warps, stages), ...]"""
    return [tuple(int(v) for v in s.split("x")) for s in text.split(",") if s]


def same_routing(a, b) -> bool:
    """Two Routings with the same ids, counts and (as sets) row lists, and weights within 1e-6."""
    close = torch.allclose(a.weights, b.weights, rtol=1e-6, atol=0)  # compiled twice: ulps (v71)
    if not (torch.equal(a.ids, b.ids) and close and torch.equal(a.counts, b.counts)):
        return False
    e = a.counts.shape[0]
    return all(
        torch.equal(a.rows[i, : a.counts[i]].sort().values, b.rows[i, : b.counts[i]].sort().values)
        for i in range(e)
    )


def _unfused(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor):
    return route_and_group(F.linear(x, w, b), TOP_K)


def sweep(
    ts: list[int],
    experts: list[int],
    launch: list[tuple[int, ...]],
    h: int,
    device: str,
    time_us: Callable[[Callable[[], object], str], float] = timed_us,
) -> list[dict]:
    rows = []
    for e in experts:
        g = torch.Generator(device).manual_seed(e)
        w = (torch.randn(e, h, generator=g, device=device) * h**-0.5).bfloat16()
        b = (torch.randn(e, generator=g, device=device) * 0.5).bfloat16()
        for t in ts:
            x = (torch.randn(t, h, generator=g, device=device) * 2).bfloat16()
            unfused = route_and_group(F.linear(x, w, b), TOP_K)
            base = time_us(partial(_unfused, x, w, b), f"E={e} T={t} unfused")
            for shape in launch:
                knobs = dict(zip(KNOBS, shape, strict=True))
                what = f"E={e} T={t} fused {'x'.join(map(str, shape))}"
                logits = torch.empty(t, e, dtype=x.dtype, device=device)
                r = switched(
                    partial(moe_router.router_route, x, w, b, TOP_K, logits=logits), moe_router, **knobs
                )()
                exact = same_routing(r, route_and_group(logits, TOP_K))
                if not exact:
                    case_failed(what, "its decisions are not route_and_group's of the logits it stored")
                alike = (r.ids == unfused.ids).all(dim=1).float().mean().item()
                fn = switched(partial(moe_router.router_route, x, w, b, TOP_K), moe_router, **knobs)
                us = time_us(fn, what)
                rows.append(
                    {
                        "e": e,
                        "t": t,
                        "shape": shape,
                        "unfused": base,
                        "us": us,
                        "exact": exact,
                        "alike": alike,
                    }
                )
    return rows


def table(rows: list[dict]) -> list[str]:
    return [
        f"| {r['e']} | {r['t']} | {'x'.join(map(str, r['shape']))} | {r['unfused']:.1f} | {r['us']:.1f} | "
        f"{r['unfused'] / r['us']:.2f} | {'yes' if r['exact'] else 'NO'} | {100 * r['alike']:.1f} % |"
        for r in rows
    ]


def record_specs(manifest: Path, device: str = "cuda") -> int:
    """The default launch's specializations at 20b's and 120b's router shapes, added to the manifest at
    `manifest` (gptoss.precompile's format, tagged as those models); returns how many were new. Run in
    a process that has not launched the kernel yet: Triton's hook sees a specialization once."""
    from gptoss.precompile import SpecRecorder, save_specs

    new = 0
    for e, layers in ((32, 24), (128, 36)):
        w = torch.randn(e, H, device=device).bfloat16()
        x, b = (
            torch.randn(FROM_T_RECORD, H, device=device).bfloat16(),
            torch.randn(e, device=device).bfloat16(),
        )
        with SpecRecorder() as rec:
            moe_router.router_route(x, w, b, TOP_K)
        new += save_specs(manifest, f"h{H}-e{e}-l{layers}", rec.specs)
    return new


FROM_T_RECORD = 1024  # any T: the kernel does not specialize on it


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--record-specs", type=Path, default=None, help="only record the default launch's specs")
    p.add_argument("--ts", type=ints, default=[65, 256, 1024, 4096, 16384])
    p.add_argument("--experts", type=ints, default=[32, 128])
    p.add_argument(
        "--shapes", type=shapes, default=[(16, 64, 4, 3), (32, 64, 4, 3), (16, 128, 4, 3), (64, 64, 4, 3)]
    )
    a = p.parse_args()
    if a.record_specs is not None:
        print(f"{record_specs(a.record_specs)} new specialization(s) in {a.record_specs}")
        return
    rows = sweep(a.ts, a.experts, a.shapes, H, "cuda")
    print_table(
        f"Router + routing, H {H}, top-{TOP_K}, bf16 (µs a call, CUDA-graph replays; ratio unfused / fused)",
        ["E", "T", "BT x BK x warps x stages", "unfused µs", "fused µs", "ratio", "exact", "as F.linear's"],
        table(rows),
    )
    sys.exit(1 if report() else 0)


if __name__ == "__main__":
    main()

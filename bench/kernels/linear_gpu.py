"""GPU timings of gptoss.kernels.linear (the GEMV projection) next to F.linear (cuBLAS), per layer.

    python bench/kernels/linear_gpu.py                       (CUDA only; bf16)
    python bench/kernels/linear_gpu.py --variants \
        default,16x256x4x4,16x128x4x8,32x256x4x3,32x128x4x6,32x512x4x3,64x256x4x3,32x256x8x4
    python bench/kernels/linear_gpu.py --ts 1,2 --variants default,preload,preload:2x4,preload:8x8
    python bench/kernels/linear_gpu.py --ts 1,2 --variants preload,stream,stream:2x4x3,stream:4x8

Shapes: QKV W [5120, 2880] and O W [2880, 4096] with their biases; gpt-oss-120b has the same
attention shapes as 20b (hidden 2880, 64 q heads, 8 kv heads, head dim 64), so these rows are both.
Each time is one CUDA graph holding LAYERS launches on LAYERS distinct weights (24 x 29.5 MB for
QKV), replayed and divided by LAYERS: W streams from HBM as in the real layer stack, never from L2
(50 MB). Times are triton.testing.do_bench medians of the replay. A variant is "default" (the
launcher's block_sizes), BNxBKxWARPSxSTAGES, or preload[:BNxWARPS] (gemv_preload, T <= its MAX_T;
with PDL each launch's W loads overlap the launch before it, as in the engine they overlap the
attention or norm kernel before the projection), or stream[:BNxWARPS[xPER_SM]] (gemv_stream: one
wave of programs walking several row blocks each). Columns: T, shape, variant, ours_us, torch_us,
ratio = ours / torch (< 1: ours is faster), ours_tbs and torch_tbs = W's bytes / time, in TB/s.
Every variant is checked against F.linear first (max |diff| <= 2^-7 |ref| + 1e-2; else FAIL).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from triton.compiler.errors import CompilationError
from triton.runtime.errors import OutOfResources

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gptoss.config import PRESETS
from gptoss.kernels import gemv_preload as gp
from gptoss.kernels import gemv_stream as gs
from gptoss.kernels.linear import GEMV_MAX_T, block_sizes, gemv

CFG = PRESETS["20b"]
H, HQ, HKV, D = CFG.hidden_size, CFG.num_attention_heads, CFG.num_key_value_heads, CFG.head_dim
SHAPES = {"qkv": ((HQ + 2 * HKV) * D, H), "o": (H, HQ * D)}  # name: (N, K)
LAYERS = 24


def _variant(spec: str, n: int, k: int) -> tuple[int, int, int, int]:
    if spec == "default":
        return block_sizes(n, k, torch.device("cuda"))
    bn, bk, warps, stages = (int(v) for v in spec.split("x"))
    return bn, bk, warps, stages


def _kernel(spec: str, n: int, k: int) -> tuple[str, Callable]:
    """(the row's variant label, the launch) of a spec."""
    if spec.startswith("preload"):  # preload or preload:BNxWARPS (gemv_preload)
        bn, warps = (int(v) for v in spec.split(":")[1].split("x")) if ":" in spec else gp.TILE
        return f"preload:{bn}x{warps}", partial(gp.gemv_preload, block_n=bn, num_warps=warps)
    if spec.startswith("stream"):  # stream or stream:BNxWARPS[xPER_SM] (gemv_stream)
        bn, warps, *per = (int(v) for v in spec.split(":")[1].split("x")) if ":" in spec else gs.TILE
        fn = partial(gs.gemv_stream, block_n=bn, num_warps=warps, per_sm=per[0] if per else None)
        return f"stream:{bn}x{warps}" + (f"x{per[0]}" if per else ""), fn
    bn, bk, warps, stages = _variant(spec, n, k)
    name = f"{spec}={bn}x{bk}x{warps}x{stages}" if spec == "default" else spec
    return name, partial(gemv, block_n=bn, block_k=bk, num_warps=warps, num_stages=stages)


def _graph_us(fn: Callable[[int], object]) -> float:
    """fn(i) for every layer i captured in one CUDA graph; the replay's median / LAYERS."""
    for i in range(LAYERS):  # eager warm-up: compiles, and lets cuBLAS pick its kernels
        fn(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(LAYERS):
            fn(i)
    return triton.testing.do_bench(graph.replay, warmup=10, rep=200, return_mode="median") * 1e3 / LAYERS


def _check(ours: torch.Tensor, want: torch.Tensor) -> bool:
    err = (ours.float() - want.float()).abs()
    return bool((err <= want.float().abs() * 2**-7 + 1e-2).all())


def bench_shape(name: str, ts: list[int], variants: list[str]) -> list[dict]:
    n, k = SHAPES[name]
    g = torch.Generator(device="cuda").manual_seed(0)
    ws = [torch.randn(n, k, device="cuda", generator=g).bfloat16() / k**0.5 for _ in range(LAYERS)]
    bs = [torch.randn(n, device="cuda", generator=g).bfloat16() for _ in range(LAYERS)]
    nbytes = n * k * 2
    rows = []
    for t in ts:
        x = torch.randn(t, k, device="cuda", generator=g).bfloat16()  # [T, K]
        torch_us = _graph_us(lambda i, x=x: F.linear(x, ws[i], bs[i]))
        want = F.linear(x, ws[0], bs[0])
        for spec in variants:
            label, fn = _kernel(spec, n, k)
            if spec.startswith(("preload", "stream")) and t > gp.MAX_T:
                continue
            try:
                ok = _check(fn(x, ws[0], bs[0]), want)
                ours = _graph_us(lambda i, x=x, fn=fn: fn(x, ws[i], bs[i]))
            # a variant too big or invalid: printed, a row that says so, and a non-zero exit below
            except (OutOfResources, CompilationError) as e:
                print(f"{name} T={t} {spec}: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
                rows.append(
                    {"T": t, "shape": f"{name} [{n}, {k}]", "variant": spec, "torch_us": round(torch_us, 2)}
                    | dict.fromkeys(("ours_us", "ratio", "ours_tbs", "torch_tbs"), "-")
                    | {"check": type(e).__name__}
                )
                continue
            rows.append(
                {
                    "T": t,
                    "shape": f"{name} [{n}, {k}]",
                    "variant": label,
                    "ours_us": round(ours, 2),
                    "torch_us": round(torch_us, 2),
                    "ratio": round(ours / torch_us, 3),
                    "ours_tbs": round(nbytes / ours / 1e6, 3),
                    "torch_tbs": round(nbytes / torch_us / 1e6, 3),
                    "check": "ok" if ok else "FAIL",
                }
            )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ts", default="1,2,4,8,16", help="token counts, comma-separated")
    ap.add_argument("--shapes", default="qkv,o")
    ap.add_argument(
        "--variants", default="default", help="comma-separated: default and/or BNxBKxWARPSxSTAGES"
    )
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise RuntimeError("bench/kernels/linear_gpu.py needs a CUDA GPU")
    ts = [int(t) for t in args.ts.split(",")]
    variants = args.variants.split(",")
    rows = [r for s in args.shapes.split(",") for r in bench_shape(s, ts, variants)]
    print(f"device: {torch.cuda.get_device_name()}  layers per graph: {LAYERS}  GEMV_MAX_T: {GEMV_MAX_T}")
    cols = ["T", "shape", "variant", "ours_us", "torch_us", "ratio", "ours_tbs", "torch_tbs", "check"]
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in cols] if rows else [len(c) for c in cols]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    for r in rows:
        print("  ".join(str(r[c]).ljust(w) for c, w in zip(cols, widths, strict=True)))
    if failed := sum(r["check"] != "ok" for r in rows):  # wrong results or variants that did not build
        sys.exit(f"{failed} of {len(rows)} rows failed (check column)")


if __name__ == "__main__":
    main()

"""GPU timings of our MXFP4 MoE (gptoss.kernels.moe), its kernel variants and vLLM's, 20b shapes.

    python bench/kernels/moe_gpu.py [--ms 1,8,64] [--variants v1,v2] [--no-vllm] [--rounds R]
        [--flush read|zero] [--dec-tiles gu:16,32,512,2,2,3+dn:16,32,512,4,4,4 ...]

--dec-tiles adds one engine variant a spec (tiles1, tiles2, ...): the engine with those split-K decode
tiles for its gate_up (gu:) and / or down (dn:) at every decode batch, e.g. to fit them to a GPU the
defaults were not chosen on (they were chosen on an H200).

--rounds R times every variant's graphs R times, interleaved, and reports medians and the spread:
for choices of a few percent (2026-11-27: 5 stages looked 6 % faster GEMM by GEMM and 7 % slower as a
whole MoE in one table, each part timed once, one after another).

Everything at once compiles ~40 kernel configurations (minutes on a fresh machine); to stay well
inside one 10-minute call, split it, e.g. --ms 1,4,16,64 --variants v1,v2,v2-2d,v2-bn16,v2-bn64,v2-s2,vllm
and --ms 256,512,1024,4096,16384 --variants v1,v2,v2-noasm,v2-b32-s2,v2-b32-wg,v2-bm64,vllm.

CUDA only; E 32 (--experts 128: 120b), H = I = 2880, top-4, bf16. Prints, in this order:
  1. bf16 subnormal checks: the v2 dequant puts the e2m1 code 0.5 on the bf16 subnormal 2^-127 and
     multiplies it by 2^(s-1) (mul.rn.bf16x2); torch.matmul and tl.dot on subnormal inputs, that
     multiply, and the v2 dequant against gptoss.mxfp4.dequantize bit for bit.
  2. one table row per (M, variant): graph_us = moe_forward captured once in a CUDA graph, graph
     replays timed (eager times at small M are mostly ~40 us of Python per Triton launch); gate_up_us
     and down_us = each GEMM alone in its own graph (routing precomputed); eager_us; hbm = the
     weight and scale bytes of the distinct experts the batch hits / graph_us / the copy bandwidth
     (3.0e12 on an H100, 4.3e12 on an H200); err = the whole MoE's output against the v2 M-tile
     kernels' at that M (relative norm; WRONG past ERR_LIMIT: such a row's time is no result).
Variants: v1 (checkpoint nibble order), v2 (bits layout, the default), v2-noasm (v2 with the
portable dequant), and v2 with other tiles at decode (v2-2d, v2-bn16, v2-bn64, v2-s2), at BM 32
(v2-b32-s2, v2-b32-wg: M 256) and BM 64 instead of 128 in prefill (v2-bm64: M >= 1024); v3 (weights
as MMA lane fragments, gptoss.kernels.moe_v3), v3ds (tl.dot_scaled on checkpoint order) and v3 tile
sweeps v3-* (M 256, 512 and >= 1024), and "dual" (v2 weights plus a v3 copy that M >= 17 runs, as
the engine on 20b), e.g. --ms 256,512,1024,4096,16384 --variants
v2,v3,dual,v3-gu128x256,v3-b32-k64s6,v3-b64-k64,vllm. "engine" is what the engine runs on 20b: the
two copies with every module switch at its default, and decode batches (M <= 16) through the
engine's decode MoE (the router GEMV, the expert GEMMs with the gate_up routing the logits, the
combine: kernel_model.decode_copy / decode_rows) instead of moe_forward.
vLLM 0.26's monolithic Triton MXFP4 expert
(triton_kernel_moe_forward: triton_kernels routing + matmul_ogs for w13 with the fused SwiGLU and
for w2 with scatter; weights converted by its own TRITON-backend loader) is the "vllm" variant,
graph-captured when it allows. Times are timing.cold_us medians in microseconds: L2 emptied before
every call (--flush read, the default since v73: by reading 256 MB, as the engine's layers leave it;
zero: do_bench's way, whose dirty lines HBM writes back during the timed call). run(rows) feeds
bench/kernels_gpu.py (see run).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gptoss.kernels import moe, moe_v3  # noqa: E402
from gptoss.kernels.moe import moe_forward, prepare_moe_weights, route  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import timing  # noqa: E402
from hbm import copy_bytes_per_s, share  # noqa: E402
from moe_dec_variants import DEC_VARIANTS  # noqa: E402
from moe_parts import dec_parts, dec_switches, switches, variant_parts  # noqa: E402
from moe_peer import ALPHA, LIMIT, TOP_K, H, I, check, vllm_moe  # noqa: E402
from moe_subnormal import subnormal_checks  # noqa: E402
from moe_variant import engine_tiles  # noqa: E402
from moe_variants import VARIANTS, Variant  # noqa: E402
from timing import peer_failed, report  # noqa: E402

E = 32  # 20b; --experts 128: 120b
MS = (1, 2, 4, 8, 16, 64, 256, 512, 1024, 4096, 16384)
EXPERT_BYTES = 2 * I * H // 2 + 2 * I * H // 32 + H * I // 2 + H * I // 32  # packed w13 + w2 and scales


def _us(fn: Callable[[], object]) -> float:
    return timing.cold_us(fn)


def _capture(fn: Callable[[], object], peer: bool = False) -> Callable[[], object] | None:
    """fn captured once in a CUDA graph (after an eager warm-up that compiles): its replay. A failure
    of ours raises (the bench fails); the vLLM peer's (peer=True) is printed and gives None, its row
    then shows the eager time only."""
    try:
        fn()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()

        # The replay keeps the graph (its memory pool) and fn alive: fn's closure holds the inputs
        # made outside the graph (routing, act). Before v23 they were freed once the variant was
        # captured, and the next variant's allocations reused them: an illegal address (120b
        # shapes, two variants at M 1, H100) or garbage rows timed in the gate_up / down columns.
        def replay(keep: Callable[[], object] = fn) -> None:
            graph.replay()

        return replay
    except Exception as e:  # noqa: BLE001 - only the peer's, of any type: reported, its row eager only
        if not peer:
            raise
        peer_failed("vLLM MoE graph capture (eager time only)", e)
        return None


def _checkpoint() -> dict[str, torch.Tensor]:
    """Random layer in the checkpoint layout: uniform e2m1 bytes, scale bytes 118..122."""
    g = torch.Generator("cuda").manual_seed(0)

    def u8(*shape: int, lo: int = 0, hi: int = 256) -> torch.Tensor:
        return torch.randint(lo, hi, shape, generator=g, device="cuda", dtype=torch.uint8)

    def bf16(*shape: int, std: float) -> torch.Tensor:
        return (torch.randn(shape, generator=g, device="cuda") * std).bfloat16()

    return {
        "router_w": bf16(E, H, std=H**-0.5),
        "router_b": bf16(E, std=0.5),
        "gate_up_blocks": u8(E, 2 * I, H // 32, 16),
        "gate_up_scales": u8(E, 2 * I, H // 32, lo=118, hi=123),
        "gate_up_bias": bf16(E, 2 * I, std=0.02),
        "down_blocks": u8(E, H, I // 32, 16),
        "down_scales": u8(E, H, I // 32, lo=118, hi=123),
        "down_bias": bf16(E, H, std=0.02),
    }


def _weights(ck: dict[str, torch.Tensor], kernels: str) -> moe.MoEWeights:
    """kernels "dual": v2 weights with a v3 copy for large batches (moe_layout.for_rows)."""
    return prepare_moe_weights(
        ck["gate_up_blocks"],
        ck["gate_up_scales"],
        ck["gate_up_bias"],
        ck["down_blocks"],
        ck["down_scales"],
        ck["down_bias"],
        kernels="v2" if kernels == "dual" else kernels,
        large="v3" if kernels == "dual" else None,
    )


def _captures(name: str, m: int, ck: dict, weights: dict, peer: Callable | None, x: torch.Tensor):
    """A variant's graph replays by part ("moe", "gate_up", ...), its eager us and its output at this
    M, or None where it does not run at M. The module switches hold only while capturing: a graph
    keeps the kernels and tiles it was captured with."""
    if name == "vllm":
        if peer is None:
            return None
        fwd = partial(peer, x)
        return {"moe": _capture(fwd, peer=True)}, _us(fwd), fwd()
    if name in DEC_VARIANTS:
        dv = DEC_VARIANTS[name]
        if m > dv.max_m:
            return None
        with dec_switches(dv):
            parts = dec_parts(ck, weights["v2"], x)
            return {k: _capture(f) for k, f in parts.items()}, _us(parts["moe"]), parts["moe"]()
    v = VARIANTS[name]
    if not v.min_m <= m <= v.max_m:
        return None
    with switches(v):
        parts = variant_parts(ck, weights[v.kernels], x, engine=v.engine)
        try:
            return {k: _capture(f) for k, f in parts.items()}, _us(parts["moe"]), parts["moe"]()
        except moe_v3.RacyTilesError as e:  # the kernels refuse these tiles here: no row, the rest timed
            print(f"  {name} at M {m}: refused: {e}", file=sys.stderr)
            REFUSED.append(f"{name} at M {m}")
            return None


REFUSED: list[str] = []  # (variant, M) pairs the kernels refused (RacyTilesError): listed after the table

# A variant's whole-MoE output against the v2 M-tile kernels' (GPU-tested) at the same M: bf16
# roundings in another summation order differ by ~5e-3; past ERR_LIMIT the row is marked WRONG, so
# a fast wrong kernel (2026-11-27: int32 x offsets, 9 % faster, 2-10 % errors) cannot pass as a gain.
ERR_LIMIT = 2e-2


def hbm_fracs(
    experts: int, graph_us: float | None, gate_up_us: float | None, down_us: float | None, copy: float
) -> dict[str, float | None]:
    """The distinct experts' weight and scale bytes over a time, as a share of a copy's bandwidth
    (bytes / s): "hbm" over the whole MoE's graph, "hbm_gemms" over its two GEMMs each alone (what
    issue 10's 80 % at M <= 16 reads: the router and the combine read no expert bytes)."""

    def frac(us: float | None) -> float | None:
        return share(experts * EXPERT_BYTES, us, copy) if us else None

    gemms = gate_up_us + down_us if gate_up_us and down_us else None
    return {"hbm": frac(graph_us), "hbm_gemms": frac(gemms)}


def _reference(ck: dict, w: moe.MoEWeights, x: torch.Tensor) -> torch.Tensor:
    with switches(Variant("v2")):
        return moe_forward(x, ck["router_w"], ck["router_b"], TOP_K, w, ALPHA, LIMIT).float()


def _err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref).norm() / ref.norm())


def table(ms: tuple[int, ...], names: list[str], with_vllm: bool, rounds: int = 1) -> list[dict]:
    """One dict per (M, variant); see the module docstring for the columns. rounds > 1: every
    variant's graphs are timed once a round, the variants interleaved, and each figure is the median
    of its rounds (spread: the whole MoE's (max - min) / median), so a clock or thermal drift during
    the table falls on every variant alike instead of on the last ones."""
    torch.manual_seed(0)
    ck = _checkpoint()
    layouts = {VARIANTS[n].kernels for n in names if n in VARIANTS} | {
        "v2" for n in names if n in DEC_VARIANTS
    }
    weights = {k: _weights(ck, k) for k in sorted(layouts | {"v2"})}  # v2: the reference
    peer = vllm_moe(ck, E) if with_vllm else None
    checked = weights.get("dual") or weights.get("v2")
    if peer is not None and checked is not None:
        check(lambda x: moe_forward(x, ck["router_w"], ck["router_b"], TOP_K, checked, ALPHA, LIMIT), peer)
    rows = []
    for m in ms:
        x = torch.randn(m, H, device="cuda").bfloat16()
        hit = route(F.linear(x, ck["router_w"], ck["router_b"]), TOP_K)[0].unique().numel()
        ref = _reference(ck, weights["v2"], x)
        runs = {n: c for n in names if (c := _captures(n, m, ck, weights, peer, x)) is not None}
        samples = {n: {k: [] for k in reps} for n, (reps, _, _) in runs.items()}
        for _ in range(rounds):
            for n, (reps, _, _) in runs.items():
                for k, rep in reps.items():
                    samples[n][k].append(None if rep is None else _us(rep))
        for name, (_, eager, out) in runs.items():
            times = {k: None if None in t else statistics.median(t) for k, t in samples[name].items()}
            g, moe_t = times["moe"], samples[name]["moe"]
            rows.append(
                {
                    "M": m,
                    "variant": name,
                    "graph_us": g,
                    "gate_up_us": times.get("gate_up"),
                    "down_us": times.get("down"),
                    "eager_us": eager,
                    "router_us": times.get("router"),
                    **hbm_fracs(hit, g, times.get("gate_up"), times.get("down"), copy_bytes_per_s()),
                    "spread": (max(moe_t) - min(moe_t)) / g if g and rounds > 1 else None,
                    "err": _err(out, ref),
                }
            )
            print(_fmt_row(rows[-1]), flush=True)
        del runs  # the graphs' memory pools go before the next M's
    return rows


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _fmt_row(r: dict) -> str:
    return (
        f"{r['M']:>6} {r['variant']:<12} {_fmt(r['graph_us'], '9.1f')} {_fmt(r['gate_up_us'], '9.1f')} "
        f"{_fmt(r['down_us'], '9.1f')} {_fmt(r['eager_us'], '9.1f')} {_fmt(r['hbm'], '6.1%')}"
        + (f"  router {r['router_us']:.1f}" if r.get("router_us") else "")
        + (f"  spread {r['spread']:.1%}" if r.get("spread") is not None else "")
        + (
            f"  err {r['err']:.1e}{' WRONG' if r['err'] > ERR_LIMIT else ''}"
            if r.get("err") is not None
            else ""
        )
    )


def run(rows: list) -> None:
    """For bench/kernels_gpu.py: one dict per M (kernel, case, ours_us = the engine's path as a CUDA
    graph replay (variant "engine": every switch at its default, decode batches as the engine's step
    runs them, moe_parts.engine_decode), vllm_us its graph replay (eager
    where it cannot be captured), ratio = ours / vllm, hbm_frac of ours (and hbm_gemms_frac: its two
    GEMMs alone), and both eager times)."""
    if not torch.cuda.is_available():
        raise RuntimeError("bench/kernels/moe_gpu.py needs a CUDA GPU")
    subnormal_checks()
    got = {(r["M"], r["variant"]): r for r in table(MS, ["engine", "vllm"], with_vllm=True)}
    for m in MS:
        ours, peer = got[(m, "engine")], got.get((m, "vllm"))
        ours_us = ours["graph_us"] or ours["eager_us"]
        vllm_us = None if peer is None else round(peer["graph_us"] or peer["eager_us"], 2)
        rows.append(
            {
                "kernel": "moe",
                "case": f"M={m}",
                "ours_us": round(ours_us, 2),
                "vllm_us": vllm_us,
                "ratio": None if not vllm_us else round(ours_us / vllm_us, 3),
                "hbm_frac": None if ours["hbm"] is None else round(ours["hbm"], 3),
                "hbm_gemms_frac": None if ours["hbm_gemms"] is None else round(ours["hbm_gemms"], 3),
                "eager_us": ours["eager_us"],
                "vllm_eager_us": None if peer is None else peer["eager_us"],
            }
        )


def main() -> None:
    global E  # the shapes every helper reads: 20b's 32 experts unless told
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--variants", default=",".join([*VARIANTS, "vllm"]))
    ap.add_argument("--no-vllm", action="store_true")
    ap.add_argument("--experts", type=int, default=E, help="128: gpt-oss-120b's experts (e128-* variants)")
    ap.add_argument("--rounds", type=int, default=1, help="time every variant this many times, interleaved")
    ap.add_argument(
        "--flush", choices=timing.FLUSHES, default=timing.FLUSH, help="how L2 is emptied (timing.py)"
    )
    ap.add_argument(
        "--dec-tiles",
        nargs="*",
        default=[],
        metavar="SPEC",
        help="engine variants tiles1.. on other split-K decode tiles: gu:TILES, dn:TILES, gu:TILES+dn:TILES",
    )
    args = ap.parse_args()
    E = args.experts
    timing.FLUSH = args.flush
    for i, spec in enumerate(args.dec_tiles, 1):
        try:
            VARIANTS[f"tiles{i}"] = engine_tiles(spec)
        except ValueError as e:
            sys.exit(str(e))
        print(f"tiles{i}: {spec}")
        args.variants += f",tiles{i}"
    if not torch.cuda.is_available():
        sys.exit("moe_gpu.py needs a CUDA GPU")
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}")
    print(f"L2 flush before each timed call: {timing.FLUSH}")
    subnormal_checks()
    names = [n for n in args.variants.split(",") if n]
    unknown = [n for n in names if n not in VARIANTS and n not in DEC_VARIANTS and n != "vllm"]
    if unknown:
        sys.exit(f"unknown variants {unknown}; known: {[*VARIANTS, *DEC_VARIANTS, 'vllm']}")
    print(f"{'M':>6} {'variant':<12} {'graph us':>9} {'gate_up':>9} {'down':>9} {'eager us':>9} {'HBM':>6}")
    ms = tuple(int(m) for m in args.ms.split(","))
    table(ms, names, with_vllm=not args.no_vllm and "vllm" in names, rounds=max(1, args.rounds))
    if REFUSED:
        print(f"{len(REFUSED)} refused by the kernels (their tiles race on this path): {', '.join(REFUSED)}")
    report()


if __name__ == "__main__":
    main()

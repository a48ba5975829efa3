"""Attention's launch settings swept at the engine's decode shapes, or prefill's (CUDA only).

    python bench/kernels/attn_sweep.py [--configs 64,4,3 32,4,3 ...] [--kv-cache-dtype fp8]
    python bench/kernels/attn_sweep.py --prefill [--configs 64,8,3,128 32,4,3,64 ...]
    python bench/kernels/attn_sweep.py --small [--configs 256,8,1@256 128,8,1@128 ...]

--prefill: attention.PREFILL_CFG / PREFILL_SLIDING_CFG's (BLOCK_N, num_warps, num_stages, rows)
over one sequence's 1k, 4k and 16k-token prefill, full and sliding (attn_gpu's prefill_case), with
vLLM's FA3 in the last column where it imports: µs and the ratio FA3 / ours (> 1: ours faster),
then each case's fastest setting. The engine takes one with GPTOSS_ATTN_PREFILL(_SLIDING)=BN,W,S,ROWS.

Decode: attention.DECODE_CFG's (BLOCK_N, num_warps, num_stages); "BN,W,S+hf" times it in the
(KV head, split, sequence) launch order (attention.HEADS_FIRST). Each row: a case (batch, context,
full or sliding) and, per config, our decode attention's µs and its share of a copy's bandwidth
(attn_gpu's byte count, hbm.py), then vLLM's FA3 where it imports and FA3's µs over the best cell's.
Times are attn_gpu's: CUDA-graph replays (timing.py); a cell whose capture failed is timed eagerly
and listed at the end. Cases: an Offline decode step's ~1000 sequences at ~1.5k context (one
split), 256 at 4k, and issue 10's table's full layers at 8k context (B 64: two splits, B 256: one),
where the H100 had us at 0.98-0.99x FA3 (v72); --cases B:CTX:full|sliding[:HINT] ... replaces them.
The engine takes a config with GPTOSS_ATTN_DECODE=BN,W,S (and GPTOSS_ATTN_HEADS_FIRST=1). Every cell
times its setting on every layer: a GPU's own full-layer setting (attention.FULL_DECODE_BY_GPU, the
engine's on an H100) is off in the sweep, so the defaults' cell is DECODE_CFG's alone.

--small: launches of up to attention.SMALL_DECODE sequences (batch 1 and the like), which take
SMALL_DECODE_CFG and SMALL_SPLIT_KEYS instead (a config "BN,W,S@KEYS"; the engine takes one with
GPTOSS_ATTN_SMALL_DECODE=BN,W,S and GPTOSS_ATTN_SMALL_SPLIT_KEYS=KEYS). Cases: batch 1 at 640
context as the batch-1 bench's steps see it (the key bound is its max_model_len, 8192: a full layer
splits 32 ways, 3 of them with keys), and kernels_gpu.py's batch-1 cases (1k and 8k context, the
bound the context). Until 2026-12-02 the decode sweep held the batch-1 cases, which DECODE_CFG
never reaches: their cells were one setting.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import timing  # noqa: E402
from attn_gpu import decode_case, fa3_peer, prefill_case  # noqa: E402

from gptoss.kernels import attention  # noqa: E402

CONFIGS = [
    "64,2,3",
    "64,2,3+hf",
    "64,4,3",
    "32,4,3",
    "128,4,3",
    "64,4,2",
    "64,4,4",
    "128,4,2",
    "128,8,3",
    "32,2,3",
    "32,2,3+hf",
    "16,4,4",
]
ENGINE_HINT = 8192  # bench/gptoss_gpu.py's --max-model-len: decode splits follow it, not the context
CASES = [  # (batch, context, sliding, key bound)
    (1024, 1536, False, None),
    (1024, 1536, True, None),
    (256, 4096, False, None),
    (64, 8192, False, None),
    (256, 8192, False, None),
]

SMALL_CONFIGS = ["256,8,1@256", "128,8,1@128", "128,4,1@128", "128,4,2@128", "64,4,1@64", "512,8,1@512"]
SMALL_CASES = [
    (1, 640, False, ENGINE_HINT),
    (1, 640, True, ENGINE_HINT),
    (1, 1024, False, None),
    (1, 8192, False, None),
    (1, 8192, True, None),
    (8, 4096, False, ENGINE_HINT),
]

PREFILL_CONFIGS = [
    "64,8,3,128",
    "32,8,3,128",
    "32,8,2,128",
    "64,8,2,128",
    "32,4,3,64",
    "32,4,2,64",
    "64,4,3,64",
    "16,4,3,64",
    "32,8,3,256",
    "64,4,2,128",
]
PREFILL_CASES = [(t, sliding) for sliding in (True, False) for t in (1024, 4096, 16384)]


def _best(times: list[float], peer: float | None) -> tuple[int, str]:
    """A case's fastest setting (its index in times; a failed cell is inf) and the peer's µs over
    its µs, as printed ("-" without a peer)."""
    best = min(range(len(times)), key=times.__getitem__)
    return best, f"{peer / times[best]:.2f}" if peer else "-"


def sweep_prefill(configs: list[str]) -> int:
    """One row a case: ours µs (TFLOP/s) at each setting, FA3's µs, then the best setting's ratio."""
    cfgs = [tuple(int(v) for v in c.split(",")) for c in configs]
    fa = fa3_peer()
    defaults = attention.PREFILL_CFG, attention.PREFILL_SLIDING_CFG
    print(f"{torch.cuda.get_device_name()}; defaults full {defaults[0]}, sliding {defaults[1]}; us (TFLOP/s)")
    print(f"{'case':16}" + "".join(f"{c:>16}" for c in configs) + f"{'FA3':>10}  best (FA3 / best)")
    failed = 0
    for t, sliding in PREFILL_CASES:
        cells, times = [], []
        for c in cfgs:
            attention.PREFILL_CFG = attention.PREFILL_SLIDING_CFG = c
            try:
                r = prefill_case(t, sliding, None)
                cells.append(f"{r['ours_us']:.1f} ({r['tflops']:.0f})")
                times.append(r["ours_us"])
            except Exception as e:  # noqa: BLE001 - one setting that fails is reported, the others still timed
                failed += 1
                print(f"T={t} {c}: {type(e).__name__}: {e}", file=sys.stderr)
                cells.append("failed")
                times.append(float("inf"))
            torch.cuda.empty_cache()
        attention.PREFILL_CFG, attention.PREFILL_SLIDING_CFG = defaults
        peer = prefill_case(t, sliding, fa)["vllm_us"] if fa is not None else None
        best, ratio = _best(times, peer)
        case = f"T={t} {'sliding' if sliding else 'full'}"
        print(
            f"{case:16}"
            + "".join(f"{cell:>16}" for cell in cells)
            + f"{peer if peer else '-':>10}  {configs[best]} ({ratio})",
            flush=True,
        )
    return failed


def _small_setting(c: str) -> dict[str, object]:
    """ "BN,W,S@KEYS" -> the attention attributes a small launch reads."""
    cfg, keys = c.split("@")
    return {"SMALL_DECODE_CFG": tuple(int(v) for v in cfg.split(",")), "SMALL_SPLIT_KEYS": int(keys)}


def decode_setting(c: str) -> dict[str, object]:
    """ "BN,W,S" or "BN,W,S+hf" -> the attention attributes a decode launch reads (+hf: HEADS_FIRST),
    with no GPU's own full-layer setting (FULL_DECODE_BY_GPU), so every layer times the one named."""
    cfg, plus, flag = c.partition("+")
    if plus and flag != "hf":
        raise ValueError(f"{c!r}: a decode setting is BN,W,S or BN,W,S+hf")
    return {
        "DECODE_CFG": tuple(int(v) for v in cfg.split(",")),
        "HEADS_FIRST": bool(plus),
        "FULL_DECODE_BY_GPU": {},
    }


def parse_case(c: str) -> tuple[int, int, bool, int | None]:
    """ "B:CTX:full|sliding[:HINT]" -> a decode case (batch, context, sliding, key bound)."""
    parts = c.split(":")
    if (
        len(parts) not in (3, 4)
        or parts[2] not in ("full", "sliding")
        or not all(p.isdigit() for p in parts[:2])
    ):
        raise ValueError(f"{c!r}: a decode case is B:CTX:full|sliding[:HINT]")
    hint = int(parts[3]) if len(parts) == 4 else None
    return int(parts[0]), int(parts[1]), parts[2] == "sliding", hint


def sweep_decode(configs: list[str], fp8: bool, small: bool = False, cases: list | None = None) -> int:
    """One row a case: ours µs (HBM share) at each DECODE_CFG setting (small: SMALL_DECODE_CFG and
    SMALL_SPLIT_KEYS over SMALL_CASES), FA3's µs and its ratio to the best cell (bf16 caches, where
    FA3 imports); returns the failed cells."""
    settings = [_small_setting(c) if small else decode_setting(c) for c in configs]
    default = {k: getattr(attention, k) for s in settings for k in s}
    kv = "fp8" if fp8 else "auto"
    fa = None if fp8 else fa3_peer()
    print(f"{torch.cuda.get_device_name()}; defaults {default}; KV {kv}; us (HBM share)")
    print(f"{'case':34}" + "".join(f"{c:>16}" for c in configs) + f"{'FA3':>10}  best (FA3 / best)")
    failed = 0
    for b, ctx, sliding, hint in cases or (SMALL_CASES if small else CASES):
        cells, times = [], []
        for c, setting in zip(configs, settings, strict=True):
            for k, v in setting.items():
                setattr(attention, k, v)
            try:
                r = decode_case(b, ctx, sliding, None, hint=hint, kv_fp8=fp8)
                cells.append(f"{r['ours_us']:.1f} ({r['hbm_frac']:.0%})")
                times.append(r["ours_us"])
            except Exception as e:  # noqa: BLE001 - one setting that fails is reported, the others still timed
                failed += 1
                print(f"B={b} ctx={ctx} {c}: {type(e).__name__}: {e}", file=sys.stderr)
                cells.append("failed")
                times.append(float("inf"))
            torch.cuda.empty_cache()
            for k, v in default.items():  # the next setting starts from the defaults
                setattr(attention, k, v)
        peer = decode_case(b, ctx, sliding, fa, hint=hint)["vllm_us"] if fa is not None else None
        best, ratio = _best(times, peer)
        case = f"B={b} ctx={ctx} {'sliding' if sliding else 'full'}{f' hint {hint}' if hint else ''}"
        print(
            f"{case:34}"
            + "".join(f"{cell:>16}" for cell in cells)
            + f"{f'{peer:.1f}' if peer else '-':>10}  {configs[best]} ({ratio})",
            flush=True,
        )
    return failed


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("attn_sweep.py needs a CUDA GPU")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--configs", nargs="+", default=None, help="default: CONFIGS, SMALL_CONFIGS or PREFILL_CONFIGS"
    )
    ap.add_argument("--kv-cache-dtype", choices=("auto", "fp8"), default="auto", help="fp8: e4m3 caches")
    ap.add_argument("--prefill", action="store_true", help="sweep prefill's settings instead")
    ap.add_argument("--small", action="store_true", help="sweep small decode launches' settings instead")
    ap.add_argument("--cases", nargs="+", default=None, help="decode cases B:CTX:full|sliding[:HINT]")
    args = ap.parse_args()
    if args.prefill:
        failed = sweep_prefill(args.configs or PREFILL_CONFIGS)
    else:
        default = SMALL_CONFIGS if args.small else CONFIGS
        cases = [parse_case(c) for c in args.cases] if args.cases else None
        failed = sweep_decode(args.configs or default, args.kv_cache_dtype == "fp8", args.small, cases)
    timing.report()
    if failed:
        sys.exit(f"{failed} cells failed (errors above)")


if __name__ == "__main__":
    main()

"""Our Triton kernels against vLLM 0.26.0's on one GPU: MoE, decode/prefill attention, small ops.

    python bench/kernels_gpu.py [--only moe,attn,ops] [--out DIR] [--flush read|zero]

Each part lives in bench/kernels/<part>_gpu.py with a run(rows) that appends one dict per case
(kernel, case, ours_us, vllm_us, ratio, hbm_frac); a part whose peer cannot be imported still
times ours. One table at the end: ratio = vLLM's time / ours (> 1: ours is faster); HBM = the bytes
read over ours_us as a share of a copy's bandwidth; GEMMs = the MoE's expert bytes over its two
GEMMs' time alone (its router and combine read none).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "bench" / "kernels"))  # the parts' own imports (timing, hbm)

import timing  # noqa: E402


def fmt(x: object, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="moe,attn,ops")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--flush", choices=timing.FLUSHES, default=timing.FLUSH, help="how the MoE rows empty L2 (timing.py)"
    )
    args = ap.parse_args()
    timing.FLUSH = args.flush
    print(f"L2 flush before each MoE call: {timing.FLUSH}")
    rows: list[dict] = []
    failed: list[str] = []
    for part in args.only.split(","):
        try:
            importlib.import_module(f"kernels.{part}_gpu").run(rows)
        except Exception:  # noqa: BLE001 - one broken part must not hide the others' numbers; counted below
            failed.append(part)
            print(f"part {part} failed:\n{traceback.format_exc()}", flush=True)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "kernels.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # The ratio is recomputed here, one convention for every part: peer time / ours (> 1: ours faster).
    print(
        f"\n{'kernel':14} {'case':30} {'ours us':>9} {'peer us':>9} {'peer':>6} {'ratio':>6} {'HBM':>5}"
        f" {'GEMMs':>6}"
    )
    for r in rows:
        # CUDA-graph replay times where a part measured them: eager times of small launches are
        # mostly Python launch overhead, for both engines.
        if r.get("graph_us"):
            ours, peer, name = r["graph_us"], r.get("vllm_graph_us"), "vllm"
        else:
            peer, name = (r.get("vllm_us"), "vllm") if r.get("vllm_us") else (r.get("torch_us"), "torch")
            ours = r.get("ours_us")
        ratio = peer / ours if peer and ours else None
        print(
            f"{r['kernel']:14} {r['case']:30} {fmt(ours, '9.1f')} {fmt(peer, '9.1f')}"
            f" {name if peer else '-':>6} "
            f"{fmt(ratio, '6.2f')} {fmt(r.get('hbm_frac'), '5.0%')} {fmt(r.get('hbm_gemms_frac'), '6.0%')}"
        )

    timing.report()
    if failed:
        print(f"\n{len(failed)} part(s) failed: {', '.join(failed)}")
        sys.exit(1)


if __name__ == "__main__":
    main()

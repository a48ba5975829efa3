"""Hardware counters of the MoE kernels (Nsight Compute), ours beside vLLM's matmul_ogs, 20b shapes
(--experts 128: 120b's).

    ncu --profile-from-start off --clock-control none --csv --page details \
        --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis \
        --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy \
        python bench/kernels/moe_ncu.py --ms 1024,16384 [--variant engine] [--vllm] > ncu.csv
    python bench/kernels/moe_ncu.py --digest ncu.csv        (no GPU: the table)
    ncu ... --page source --print-source sass -k regex:gate_up_v3 python bench/kernels/moe_ncu.py > sass.csv
    python bench/kernels/moe_ncu.py --sass-digest sass.csv  (no GPU: where the K loop's warps wait)

Timing says which MoE is slower (bench/kernels/moe_gpu.py); this says why: per kernel launch its
duration, SM, memory, L2 and DRAM throughput against peak, issue slots used, L2 hit rate, occupancy
and registers, and its warps' three largest stall reasons. The GPU run
profiles only what lies between torch.cuda.profiler.start() and stop(): one eager forward per M
(after a warm-up that compiled every kernel), the launches in the order they ran. bench/moe_ncu_gpu.sh
runs both steps on the GPU.
"""

from __future__ import annotations

import argparse
import csv
import io
import re
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

# (label, ncu's section, metric name) of the digest's columns; names as Nsight Compute 2025 prints them.
COLUMNS = [
    ("us", "GPU Speed Of Light Throughput", "Duration"),
    ("sm%", "GPU Speed Of Light Throughput", "Compute (SM) Throughput"),
    ("mem%", "GPU Speed Of Light Throughput", "Memory Throughput"),
    ("l2%", "GPU Speed Of Light Throughput", "L2 Cache Throughput"),
    ("dram%", "GPU Speed Of Light Throughput", "DRAM Throughput"),
    ("issue%", "Compute Workload Analysis", "Issue Slots Busy"),
    ("l2hit%", "Memory Workload Analysis", "L2 Hit Rate"),
    ("occ%", "Occupancy", "Achieved Occupancy"),
    ("regs", "Launch Statistics", "Registers Per Thread"),
]
# The per-reason stall metrics (asked for with --metrics, bench/moe_ncu_gpu.sh: STALLS): cycles a warp
# spends stalled on that reason per issued instruction.
# Durations to microseconds, in the unit names of Nsight Compute 2023 (usecond ...) and 2025 (us, ns ...).
_TO_US = {"msecond": 1e3, "ms": 1e3, "nsecond": 1e-3, "ns": 1e-3, "second": 1e6, "s": 1e6}
STALL = re.compile(r"issue_stalled_(\w+?)_per_issue_active")


def _short(kernel: str) -> str:
    return re.sub(r"\(.*", "", kernel).strip()[:28]


def digest(text: str, by_kernel: bool = False) -> list[str]:
    """ncu's --csv --page details output -> one line a kernel launch (ID), columns as COLUMNS, then
    its warps' three largest stall reasons (cycles stalled per issued instruction). by_kernel (a
    whole decode step's ~290 launches): one line a kernel name instead, its launches' count first,
    the columns their means ("us" their sum), the most time first, the stalls summed over launches."""
    rows: dict[str, dict] = defaultdict(dict)
    names: dict[str, str] = {}
    stalls: dict[str, list[tuple[float, str]]] = defaultdict(list)
    start = text.find('"ID"')  # ncu prints its own log lines before the table
    if start < 0:
        return ["no ncu table in the input (did ncu profile anything? see its log lines above)"]
    for r in csv.DictReader(io.StringIO(text[start:])):
        launch, section, metric = r["ID"], r.get("Section Name", ""), r.get("Metric Name", "")
        names[launch] = _short(r.get("Kernel Name", ""))
        value = r.get("Metric Value", "").replace(",", "")
        for label, sec, name in COLUMNS:
            if section == sec and metric == name:
                unit = r.get("Metric Unit", "")
                scale = _TO_US.get(unit, 1.0)
                rows[launch][label] = float(value) * scale if value else None
        if (m := STALL.search(metric)) and value and m[1] != "selected":  # selected: issuing, no stall
            stalls[launch].append((float(value), m[1]))
    if by_kernel:
        return _by_kernel(rows, names, stalls)
    out = [_line("id", "kernel", None, "top stalls")]
    for launch in sorted(rows, key=int):
        top = ", ".join(f"{n} {v:.1f}" for v, n in sorted(stalls[launch], reverse=True)[:3])
        out.append(_line(launch, names[launch], rows[launch].get, top))
    return out


def _line(first: str, name: str, value: Callable[[str], float | None] | None, top: str) -> str:
    """A table line: `first` (launch id or count), the kernel, each COLUMNS cell (value(label); None
    or no value: "-"; value None: the header's labels), the top stalls."""
    if value is None:
        cells = " ".join(f"{label:>7}" for label, _, _ in COLUMNS)
    else:
        cells = " ".join(
            f"{v:7.1f}" if (v := value(label)) is not None else f"{'-':>7}" for label, _, _ in COLUMNS
        )
    return f"{first:>4} {name:<28} {cells}  {top}"


def _by_kernel(rows: dict[str, dict], names: dict[str, str], stalls: dict[str, list]) -> list[str]:
    groups: dict[str, list[str]] = defaultdict(list)
    for launch in rows:
        groups[names[launch]].append(launch)

    def column(launches: list[str], label: str) -> float | None:
        vals = [v for x in launches if (v := rows[x].get(label)) is not None]
        if not vals:
            return None
        return sum(vals) if label == "us" else sum(vals) / len(vals)

    out = [_line("n", "kernel", None, "top stalls")]
    for name, launches in sorted(groups.items(), key=lambda kv: -(column(kv[1], "us") or 0.0)):
        summed: dict[str, float] = defaultdict(float)
        for x in launches:
            for v, reason in stalls[x]:
                summed[reason] += v / len(launches)
        top = ", ".join(f"{n} {v:.1f}" for n, v in sorted(summed.items(), key=lambda kv: -kv[1])[:3])
        out.append(_line(str(len(launches)), name, lambda label, ls=launches: column(ls, label), top))
    return out


def _num(v: str | None, bad: list[str]) -> float:
    """A CSV cell as a number: thousands separators dropped, an empty cell 0; a cell that is neither
    counts as 0 and is kept in bad, which the digest reports."""
    text = (v or "").replace(",", "").strip()
    if not text:
        return 0.0
    try:
        return float(text)
    except ValueError:
        bad.append(text)
        return 0.0


def sass_digest(text: str, top: int = 25) -> list[str]:
    """ncu's --csv --page source --print-source sass output -> per kernel: each stall reason's and
    each opcode's share of its warp stall samples, then the `top` instructions with the most samples
    (where the warps wait: a cp.async wait, a barrier, a wgmma wait, a load) with every nonzero stall
    column of the row. Each kernel's table starts at a header row holding "Source"; a layout this
    does not know is echoed in part."""
    out: list[str] = []
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if '"Source"' in line and "Stall Sampling" in line]
    if not starts:
        return ["no source table with stall samples in the input; its first lines:", *lines[:8]]
    for n, i in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(lines)
        rows = list(csv.DictReader(io.StringIO("\n".join(lines[i:end]))))
        key = next((k for k in rows[0] if "Stall Sampling (All" in k), None) if rows else None
        if key is None:
            out.append(
                f"kernel table {n}: no 'Warp Stall Sampling (All Samples)' column; header: {lines[i][:200]}"
            )
            continue
        stall_cols = [k for k in rows[0] if k != key and "stall" in k.lower()]
        bad: list[str] = []  # cells that were not numbers, read as 0 and reported below
        nums = [{k: _num(r[k], bad) for k in (key, *stall_cols)} for r in rows]  # each cell parsed once
        total = sum(v[key] for v in nums) or 1.0
        out.append(f"kernel table {n}: {len(rows)} instructions, {total:.0f} samples ({key})")
        # The kernel as a whole: each reason's share of the samples, then each opcode's.
        reasons = {k: sum(v[k] for v in nums) for k in stall_cols if k.startswith("stall_") and "(" not in k}
        opcodes: dict[str, float] = defaultdict(float)
        for r, v in zip(rows, nums, strict=True):
            words = r["Source"].split()  # "@!P4 BRA 0x..." -> BRA, "HGMMA.64x128x16.F32 ..." -> HGMMA
            if words:
                op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
                opcodes[op.split(".")[0]] += v[key]
        for label, shares in (("reasons", reasons), ("opcodes", opcodes)):
            whole = sum(shares.values()) or 1.0
            top_shares = sorted(shares.items(), key=lambda kv: -kv[1])[:10]
            out.append(
                f"  {label}: "
                + ", ".join(f"{k.removeprefix('stall_')} {100 * v / whole:.1f}%" for k, v in top_shares)
            )
        ranked = sorted(zip(rows, nums, strict=True), key=lambda rv: rv[1][key], reverse=True)
        for r, v in ranked[:top]:
            extra = ", ".join(f"{k} {v[k]:.0f}" for k in stall_cols if v[k] > 0)
            addr = r.get("Address", r.get("# Address", ""))
            out.append(f"  {100 * v[key] / total:5.1f}%  {addr:>8}  {r['Source'][:60]:<60}  {extra}")
        if bad:
            out.append(f"  {len(bad)} cells not numbers, read as 0: {', '.join(sorted(set(bad))[:5])}")
    return out


def profile(ms: list[int], variant: str, with_vllm: bool, experts: int) -> None:
    """The GPU side, under ncu: one eager forward per M of our variant (and vLLM's), profiled alone;
    experts 128 for 120b's shapes (its Offline decode steps: ~20 rows an expert at M 664)."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import moe_gpu
    from moe_parts import switches, variant_parts
    from moe_peer import vllm_moe
    from moe_variants import VARIANTS

    v = VARIANTS[variant]
    moe_gpu.E = experts  # the shapes moe_gpu's helpers read
    ck = moe_gpu._checkpoint()
    w = moe_gpu._weights(ck, v.kernels)
    peer = vllm_moe(ck, moe_gpu.E) if with_vllm else None
    for m in ms:
        x = torch.randn(m, moe_gpu.H, device="cuda").bfloat16()
        with switches(v):
            ours = variant_parts(ck, w, x, engine=v.engine)["moe"]
            ours()  # compiles (and autotunes nothing): the profiled launch is a warm one
            if peer is not None:
                peer(x)
            torch.cuda.synchronize()
            print(f"profiling M {m}: {variant}" + (" then vllm" if peer else ""), file=sys.stderr)
            torch.cuda.profiler.start()
            ours()
            if peer is not None:
                peer(x)
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--digest", type=Path, help="ncu's CSV: print the table (no GPU needed)")
    ap.add_argument("--by-kernel", action="store_true", help="--digest: one line a kernel name")
    ap.add_argument("--sass-digest", type=Path, help="ncu's source-page CSV: the most stalled instructions")
    ap.add_argument("--ms", default="1024,16384")
    ap.add_argument("--variant", default="engine", help="a moe_variants.VARIANTS name")
    ap.add_argument("--vllm", action="store_true", help="vLLM's MoE after ours, at each M")
    ap.add_argument("--experts", type=int, default=32, help="128: gpt-oss-120b's experts")
    args = ap.parse_args()
    if args.digest:
        print("\n".join(digest(args.digest.read_text(), args.by_kernel)))
    elif args.sass_digest:
        print("\n".join(sass_digest(args.sass_digest.read_text())))
    else:
        profile([int(m) for m in args.ms.split(",")], args.variant, args.vllm, args.experts)


if __name__ == "__main__":
    main()

"""bench/kernels/moe_ncu.py --digest: Nsight Compute's CSV (details page) -> one line a kernel launch,
durations in microseconds whatever unit ncu chose, and the three largest stall reasons."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "kernels"))

from moe_ncu import digest  # noqa: E402

COLS = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size"]
COLS += ["Grid Size", "Device", "CC", "Section Name", "Metric Name", "Metric Unit", "Metric Value"]
HEAD = ",".join(f'"{c}"' for c in COLS)
SOL = "GPU Speed Of Light Throughput"


def _row(launch: int, kernel: str, section: str, metric: str, unit: str, value: str) -> str:
    fields = [
        str(launch),
        "4242",
        "python3",
        "127.0.0.1",
        kernel,
        "1",
        "7",
        "(256, 1, 1)",
        "(45, 47, 1)",
        "0",
        "9.0",
    ]
    return ",".join(f'"{f}"' for f in [*fields, section, metric, unit, value])


def test_one_line_a_launch_with_units_and_top_stalls():
    lines = [
        "==PROF== Connected to process 4242",  # ncu's own log lines come first
        HEAD,
        _row(0, "_gate_up_v3_kernel(int, float)", SOL, "Duration", "usecond", "480.25"),
        _row(0, "_gate_up_v3_kernel(int, float)", SOL, "Compute (SM) Throughput", "%", "61.2"),
        _row(0, "_gate_up_v3_kernel(int, float)", "Launch Statistics", "Registers Per Thread", "reg", "255"),
        _row(0, "_gate_up_v3_kernel(int, float)", "Command line profiler metrics",
             "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio", "", "3.5"),
        _row(0, "_gate_up_v3_kernel(int, float)", "Command line profiler metrics",
             "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio", "", "9.25"),
        _row(0, "_gate_up_v3_kernel(int, float)", "Command line profiler metrics",
             "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio", "", "1.0"),
        _row(0, "_gate_up_v3_kernel(int, float)", "Command line profiler metrics",
             "smsp__average_warps_issue_stalled_selected_per_issue_active.ratio", "", "50.0"),
        _row(1, "_matmul_ogs_NNT_bf16xbf16xmxfp4", SOL, "Duration", "msecond", "1,234.5"),
        _row(1, "_matmul_ogs_NNT_bf16xbf16xmxfp4", SOL, "DRAM Throughput", "%", "12.5"),
    ]  # fmt: skip
    out = digest("\n".join(lines))
    assert out[0].split()[:3] == ["id", "kernel", "us"] and out[0].endswith("top stalls")
    first = out[1].split()
    assert first[:5] == ["0", "_gate_up_v3_kernel", "480.2", "61.2", "-"]
    assert first[10] == "255.0"
    # the three largest, first first; "selected" (issuing) is not a stall
    assert out[1].endswith("long_scoreboard 9.2, barrier 3.5, wait 1.0")
    assert out[2].split()[:3] == ["1", "_matmul_ogs_NNT_bf16xbf16xmx", "1234500.0"]  # ms -> us, thousands


def test_no_table_says_so():
    assert digest("==PROF== Connected\n==ERROR== failed") == [
        "no ncu table in the input (did ncu profile anything? see its log lines above)"
    ]

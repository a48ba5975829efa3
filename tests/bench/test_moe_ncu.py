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


def test_by_kernel_sums_a_steps_launches_of_each_kernel():
    """A decode step runs each kernel once a layer: one line a name, most time first, its count,
    the durations summed and the other columns and stalls averaged over its launches."""
    stall = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
    cl = "Command line profiler metrics"
    lines = [HEAD]
    for launch, (name, us, dram, stalls) in enumerate(
        [
            ("_rmsnorm_kernel", "3.0", "5.0", {"long_scoreboard": "8.0"}),
            ("_gate_up_v3_dec_kernel", "20.0", "40.0", {"long_scoreboard": "6.0", "barrier": "1.0"}),
            ("_rmsnorm_kernel", "5.0", "7.0", {"long_scoreboard": "4.0", "wait": "2.0"}),
            ("_gate_up_v3_dec_kernel", "22.0", "50.0", {"long_scoreboard": "8.0", "barrier": "3.0"}),
        ]
    ):
        lines += [
            _row(launch, name, SOL, "Duration", "usecond", us),
            _row(launch, name, SOL, "DRAM Throughput", "%", dram),
        ]
        lines += [_row(launch, name, cl, stall.format(k), "", v) for k, v in stalls.items()]
    out = digest("\n".join(lines), by_kernel=True)
    assert out[0].split()[:3] == ["n", "kernel", "us"]
    gu, norm = out[1].split(), out[2].split()
    assert gu[:3] == ["2", "_gate_up_v3_dec_kernel", "42.0"] and gu[6] == "45.0"  # us summed, dram% averaged
    assert norm[:3] == ["2", "_rmsnorm_kernel", "8.0"] and norm[6] == "6.0"
    assert out[1].endswith("long_scoreboard 7.0, barrier 2.0")
    assert out[2].endswith("long_scoreboard 6.0, wait 1.0")  # a stall one launch lacks counts as 0 there
    assert len(out) == 3


def test_no_table_says_so():
    assert digest("==PROF== Connected\n==ERROR== failed") == [
        "no ncu table in the input (did ncu profile anything? see its log lines above)"
    ]


def test_sass_digest_ranks_instructions_by_stall_samples():
    from moe_ncu import sass_digest

    head = '"Address","Source","Warp Stall Sampling (All Samples)","stall_barrier","stall_wait",'
    head += '"stall_barrier (Not Issued)"'
    rows = [
        '"00001110","@!P4 DEPBAR.LE SB0, 0x6","300","0","300","0"',
        '"00001160","BAR.SYNC.DEFER_BLOCKING 0x0","600","600","0","580"',
        '"00001460","HGMMA.64x128x16.F32.BF16 R24, R100, gdesc[UR12], R24, gsb0","100","0","100","0"',
    ]
    out = sass_digest("\n".join(["==PROF== Disconnected", head, *rows]), top=2)
    assert out[0] == "kernel table 0: 3 instructions, 1000 samples (Warp Stall Sampling (All Samples))"
    assert out[1] == "  reasons: barrier 60.0%, wait 40.0%"  # the (Not Issued) columns are not summed again
    assert out[2] == "  opcodes: BAR 60.0%, DEPBAR 30.0%, HGMMA 10.0%"
    assert out[3].split() == ["60.0%", "00001160", "BAR.SYNC.DEFER_BLOCKING", "0x0",
                              "stall_barrier", "600,", "stall_barrier", "(Not", "Issued)", "580"]  # fmt: skip
    assert out[4].split()[:4] == ["30.0%", "00001110", "@!P4", "DEPBAR.LE"]
    assert len(out) == 5


def test_nanoseconds_as_ncu_2025_prints_them():
    out = digest("\n".join([HEAD, _row(0, "_down_v3_kernel", SOL, "Duration", "ns", "210,368")]))
    assert out[1].split()[:3] == ["0", "_down_v3_kernel", "210.4"]


def test_sass_digest_echoes_an_unknown_layout():
    from moe_ncu import sass_digest

    out = sass_digest('"ID","Kernel Name"\n"0","k"')
    assert out[0].startswith("no source table with stall samples")
    assert out[1] == '"ID","Kernel Name"'


def test_sass_digest_counts_cells_that_are_not_numbers():
    from moe_ncu import sass_digest

    head = '"Address","Source","Warp Stall Sampling (All Samples)","stall_wait"'
    rows = ['"00000010","BAR.SYNC 0x0","n/a","3"', '"00000020","EXIT","1,000",""']
    out = sass_digest("\n".join([head, *rows]), top=2)
    assert out[0] == "kernel table 0: 2 instructions, 1000 samples (Warp Stall Sampling (All Samples))"
    assert out[-1] == "  1 cells not numbers, read as 0: n/a"  # the empty cell is 0 samples, not a fault

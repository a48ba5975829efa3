"""bench/kernels/moe_v3_dec_sass.py compiles both split-K decode GEMMs for sm_90a on CPU: a tile's register
cap (rNREG) reaches ptxas, so the capped tiles use at most that many registers and fit more programs an
SM, and programs_an_sm counts them as Hopper allocates (256-register units a warp)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench" / "kernels"))

from moe_v3_dec_sass import programs_an_sm  # noqa: E402

from tests.bench.gpu_stubs import run_compiler_tool  # noqa: E402


def test_programs_an_sm_counts_registers_shared_memory_and_warps():
    assert programs_an_sm(128, 20_000, 4) == 4  # 128 x 32 = 4096 a warp, 16384 a program
    assert programs_an_sm(95, 20_000, 4) == 5  # 95 x 32 rounds up to 3072 a warp
    assert programs_an_sm(163, 51_232, 4) == 3  # 163 x 32 -> 5376: 3 by registers, 4 by shared memory
    assert programs_an_sm(64, 100_000, 4) == 2  # shared memory binds
    assert programs_an_sm(32, 0, 2) == 32  # the 64 warp slots bind


def test_bad_tiles_are_refused_with_the_option_named():
    p = run_compiler_tool("moe_v3_dec_sass.py", "--tiles", "8,64,512,4,4")
    assert p.returncode == 2 and "--tiles must be BM,BN,BK,SPLIT,WARPS,STAGES" in p.stderr


def test_a_register_cap_reaches_both_compiled_kernels():
    p = run_compiler_tool("moe_v3_dec_sass.py", "--tiles", "8,64,512,4,4,3", "8,64,512,4,4,3,r128")
    assert p.returncode == 0, p.stderr
    rows = re.findall(
        r"^(gate_up|down) DecTiles\(.*?maxnreg=(\w+).*?: regs (\d+),.*\n.*?\n\s+(\d+) programs",
        p.stdout,
        re.M,
    )
    got = {(name, cap): (int(regs), int(n)) for name, cap, regs, n in rows}
    assert set(got) == {(g, c) for g in ("gate_up", "down") for c in ("None", "128")}
    for gemm in ("gate_up", "down"):
        assert got[(gemm, "128")][0] <= 128 < got[(gemm, "None")][0]  # uncapped, both take more
        assert got[(gemm, "128")][1] > got[(gemm, "None")][1]  # so the cap fits more programs an SM


def test_ops_count_a_k_steps_opcodes_and_the_dequants_share():
    """--ops: batch 1's gate_up tiles (32 weight rows, a 256-K step over 2 warps) hold 16 HMMAs a step
    (2 row blocks x 8 k16 steps of a warp's 128 K) and 64 HMUL2s (4 a word of 8 values: 16 words a
    lane); the dequant's opcodes are most of the loop (v61: 287 of 402), and the shares add up."""
    p = run_compiler_tool("moe_v3_dec_sass.py", "--tiles", "1,32,256,2,2,4", "--ops", "40")
    assert p.returncode == 0, p.stderr
    lines = re.findall(r"^    K loop (\d+) ins, dequant (\d+) \((\d+)%\): (.*)$", p.stdout, re.M)
    assert len(lines) == 2  # gate_up, down
    for n, deq, pct, common in lines:
        ops = {o: int(c) for o, c in (x.rsplit(" ", 1) for x in common.split(", "))}
        assert ops["HMMA"] == 16 and ops["HMUL2"] == 64
        assert int(deq) == sum(ops.get(o, 0) for o in ("IMAD", "LOP3", "SHF", "PRMT", "HMUL2"))
        assert sum(ops.values()) == int(n) and 0.6 < int(deq) / int(n) < 0.8
        assert int(pct) == round(100 * int(deq) / int(n))

"""bench/kernels/attn_sass.py compiles decode attention for sm_90a on CPU and finds its key loops:
the float8 cache's loops hold the e4m3 unpacking and byte loads that the bf16 cache's lack. (A
subprocess: the tests' own Triton runs interpreted, and an interpreted kernel does not compile.)"""

from __future__ import annotations

import re

from tests.bench.gpu_stubs import run_compiler_tool


def test_fp8_key_loops_unpack_e4m3_and_bf16_ones_do_not():
    p = run_compiler_tool("attn_sass.py", "--cfg", "32,2,3")
    assert p.returncode == 0, p.stderr
    blocks = re.split(r"^cfg 32,2,3, ", p.stdout, flags=re.M)[1:]
    assert [b.split(" cache")[0] for b in blocks] == ["bf16", "fp8"]
    first = {}
    for b in blocks:
        loops = re.findall(r"^  loop +(\d+) ins: (.*)$", b, re.M)
        assert loops  # each holds an HMMA (key_loops keeps only those)
        first[b.split(" cache")[0]] = (int(loops[0][0]), loops[0][1])  # the shortest: cached keys
    assert "E4M3.UNPACK_B" not in first["bf16"][1] and "LDS.U8" not in first["bf16"][1]
    assert "F2FP.F16.E4M3.UNPACK_B" in first["fp8"][1] and "LDS.U8" in first["fp8"][1]
    assert first["fp8"][0] > first["bf16"][0]

"""L2 prefetch (gptoss.kernels.prefetch): the switch, the instruction in the compiled kernels, and
results bitwise unchanged by it on the GPU.

The SASS checks compile for sm_90a on any machine (Triton's bundled ptxas and cuobjdump) in a
child process without TRITON_INTERPRET, so CI sees the bulk prefetch appear exactly when asked for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from gptoss.kernels import prefetch  # noqa: E402

REPO = Path(__file__).resolve().parents[3]

# Compiles one kernel for sm_90a and prints how many bulk L2 prefetches its SASS holds.
_SASS_COUNT = r"""
import json, re, subprocess, sys, tempfile
from pathlib import Path
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from gptoss.kernels import linear, moe_decode

which, on = sys.argv[1], sys.argv[2] == "1"
if which == "gemv":
    kernel = linear._gemv_kernel
    sig = dict(x_ptr="*bf16", w_ptr="*bf16", b_ptr="*bf16", y_ptr="*bf16", T="i32", N="i32", K="i32",
               stride_x="i32", stride_w="i32", stride_y="i32")
    consts = dict(HAS_BIAS=True, TB=16, BN=32, BK=128, PRECISION="tf32", UPCAST=False)
else:
    gate_up = which == "gate_up"
    kernel = moe_decode._gate_up_dec_kernel if gate_up else moe_decode._down_dec_kernel
    sig = (dict(x_ptr="*bf16") if gate_up else dict(a_ptr="*bf16")) | dict(
        w_ptr="*u8", s_ptr="*i32", b_ptr="*fp32")
    sig |= dict(act_ptr="*bf16") if gate_up else dict(y_ptr="*bf16")
    sig |= dict(counts_ptr="*i32", rows_ptr="*i32", T="i32")
    strides = ("we", "wp", "wn", "se", "sp", "sn") if gate_up else ("we", "wn", "se", "sn")
    sig |= (dict(stride_x="i32") if gate_up else {}) | {f"stride_{s}": "i32" for s in strides}
    sig |= dict(alpha="fp32", limit="fp32") if gate_up else {}
    consts = dict(N=2880, K=2880, E=32, BE=32, BM=1, BN=16, BK=512, SPLIT=4, PREC="tf32", ASM=True)
    consts |= dict(TOP_K=4) if gate_up else {}
consts |= dict(PREFETCH=on, NT=128, PDL=True)
idx = kernel.arg_names.index
src = ASTSource(kernel, {**sig, **dict.fromkeys(consts, "constexpr")},
                constexprs={(idx(k),): v for k, v in consts.items()})
compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 3})
cuobjdump = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
    f.write(compiled.asm["cubin"])
    f.flush()
    sass = subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True, check=True).stdout
print(json.dumps({"bulk_prefetches": len(re.findall(r"UBLKPF\.L2", sass))}))
"""


def test_switch_values():
    assert prefetch._parts("1") == frozenset(prefetch.PARTS)
    assert prefetch._parts("") == frozenset(prefetch.PARTS)
    assert prefetch._parts("0") == frozenset()
    assert prefetch._parts("gemv,down") == {"gemv", "down"}
    with pytest.raises(ValueError, match=r"GPTOSS_PREFETCH='gemv,qkv': expected 0, 1 or a comma list of "):
        prefetch._parts("gemv,qkv")


def test_off_without_a_compiled_gpu():
    """CPU tensors (and the interpreter) never get the asm: it only exists on Hopper."""
    assert not prefetch.on(torch.zeros(1), "gemv")


@pytest.mark.parametrize("which, prefetches", [("gemv", 1), ("gate_up", 2), ("down", 2)])
def test_bulk_prefetch_in_the_sass_exactly_when_on(which, prefetches):
    """Each prefetched span is one waterfall loop of UBLKPF.L2 (a uniform-register instruction);
    gemv has one span (its W rows), the MoE kernels two per loop (weights and scales; gate_up's
    gate and up halves are one unrolled loop each)."""
    if not (Path(__import__("triton").__file__).parent / "backends/nvidia/bin/cuobjdump").exists():
        pytest.skip("Triton's bundled cuobjdump is missing")
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(REPO))
    counts = {}
    for on in ("1", "0"):
        out = subprocess.run(
            [sys.executable, "-c", _SASS_COUNT, which, on],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
            timeout=600,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        counts[on] = json.loads(out.stdout.strip().splitlines()[-1])["bulk_prefetches"]
    assert counts["0"] == 0
    assert counts["1"] >= prefetches


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (compiled kernels)")
def test_results_bitwise_equal_with_and_without_prefetch(monkeypatch):
    """A prefetch moves bytes into L2 and nothing else: the GEMV and the decode MoE give the same
    bits either way (T 1 and 5, 20b shapes)."""
    from gptoss.kernels import linear, moe_decode
    from gptoss.kernels.moe_routing import route_and_group
    from tests.gptoss.kernels.test_moe_kernel import ALPHA, LIMIT, make_moe

    if not prefetch.pdl.compiled_on_hopper(torch.zeros(1, device="cuda")):
        pytest.skip("bulk prefetch needs Hopper or later")
    ref, w = make_moe(32, 2880, 2880, 4, torch.bfloat16, seed=3)
    wo = torch.randn(2880, 4096, device="cuda").bfloat16()
    bo = torch.randn(2880, device="cuda").bfloat16()
    for t in (1, 5):
        x = torch.randn(t, 2880, device="cuda").bfloat16()
        xo = torch.randn(t, 4096, device="cuda").bfloat16()
        r = route_and_group(torch.randn(t, 32, device="cuda"), 4)
        outs = {}
        for parts in (frozenset(prefetch.PARTS), frozenset()):
            monkeypatch.setattr(prefetch, "ENABLED", parts)
            outs[bool(parts)] = (
                linear.gemv(xo, wo, bo),
                moe_decode.experts_dec(x, r, w, ALPHA, LIMIT, combined=False),
            )
        for a, b in zip(outs[True], outs[False], strict=True):
            assert torch.equal(a, b)

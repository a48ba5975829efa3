"""SASS statistics of batch 1's preloading down (moe_v3_down_pre), compiled for sm_90a on CPU.

    python bench/kernels/down_pre_sass.py

At 20b / 120b's down (bf16, H = I = 2880, top-4), for each tile (BN, warps): registers, spills,
how many 16-byte weight loads leave before the PDL wait (griddepcontrol.wait: ACQBULK in SASS) and
after it, and the instructions after the wait a weight value (what the kernel still does once the
gate_up has ended).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.kernels.moe_decode_sass import _compile, disassemble  # noqa: E402
from gptoss.kernels import moe_v3_down_pre as p  # noqa: E402

SIG = dict(
    a_ptr="*bf16",
    w_ptr="*i32",
    s_ptr="*i32",
    b_ptr="*bf16",
    y_ptr="*bf16",
    logits_ptr="*bf16",
    stride_we="i32",
    stride_wn="i32",
    stride_se="i32",
    stride_sn="i32",
)


def main() -> None:
    kc1, kc2 = p.chunk_parts(2880)
    for experts in (32, 128):
        for bn, warps in ((16, 2), (16, 4), (32, 4), (32, 8)):
            consts = dict(N=2880, K=2880, E=experts, TOP_K=4, KP=4, BE=experts, BN=bn, KC1=kc1, KC2=kc2)
            k = _compile(p._down_pre_kernel, SIG, consts | dict(ASM=True, PDL=True), warps, 1)
            res, _, ins = disassemble(k)
            wait = next((i for i, (_, x) in enumerate(ins) if "ACQBULK" in x), len(ins))
            ldg = [i for i, (_, x) in enumerate(ins) if re.search(r"\bLDG\.E\.128", x)]
            spills = sum(bool(re.search(r"\b(STL|LDL)\b", x)) for _, x in ins)
            values = bn * 2880 / (32 * warps)  # weight values a thread
            regs = re.search(r"REG:(\d+)", res)[1]
            print(
                f"E {experts} BN {bn} warps {warps}: regs {regs}, spills {spills}, "
                f"LDG.128 before the wait {sum(i < wait for i in ldg)} / after {sum(i > wait for i in ldg)}, "
                f"{len(ins) - wait} instructions after the wait ({(len(ins) - wait) / values:.2f} a value)"
            )


if __name__ == "__main__":
    main()

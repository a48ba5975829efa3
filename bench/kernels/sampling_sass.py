"""SASS of the Gumbel draw's pass-1 kernel (gptoss.kernels.sampling_draw), compiled for sm_90a on CPU, at
each SCREEN mode: the loop's instructions an element, and of them the logs' branch, which a screened
step takes only when a bound could beat the best z seen (the "cheap" rest runs on every step).

    python bench/kernels/sampling_sass.py [--cut] [--bf16]

No GPU needed (as moe_decode_sass.py). One line a mode: registers; the loop (one [1, BLOCK] step of
a row, 8 elements a thread at BLOCK 1024 and 4 warps) in instructions an element; the logs' branch
(the smallest forward branch inside the loop that holds 90 % of its FFMAs: the screen's); the
rest; the loop's atomics (REDG/ATOMG) and volatile loads. Mode 0 has no screen: every step of a
sampled row takes the logs (its one branch around them skips them for all-greedy programs only).
What a step costs on a GPU is the rest plus the share of steps that take the logs
(tests/gptoss/kernels/test_sampling_screen.py counts those: ~20 % at SCREEN 1 and ~3 % at SCREEN 2
over a full random row in the interpreter).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from moe_decode_sass import _compile, branches, disassemble, opcode  # noqa: E402

from gptoss.kernels import sampling_draw  # noqa: E402

SIG = dict(
    logits_ptr="*fp32",
    stride_row="i32",
    temp_ptr="*fp32",
    seed_ptr="*i64",
    off_ptr="*i64",
    pval_ptr="*fp32",
    pidx_ptr="*i32",
    out_ptr="*i64",
    B="i32",
    V="i32",
    n_chunks="i32",
)
BLOCK, WARPS = 1024, 4
PER_THREAD = BLOCK // (32 * WARPS)  # elements a thread takes each step


def compile_mode(screen: int, cut: bool, bf16: bool = False):
    sig = dict(SIG, logits_ptr="*bf16" if bf16 else "*fp32")
    if cut:
        sig |= dict(tau_ptr="*fp32", cut_ptr="*i32")
    sig["CHUNK"] = "i32"  # an int at run time, as the engine launches it
    consts = dict(ROWS=1, BLOCK=BLOCK, SINGLE=False, SCREEN=screen)
    if screen == 2:  # the shared floor; below 2 the engine passes None (a constexpr)
        sig["floor_ptr"] = "*fp32"
    else:
        consts["floor_ptr"] = None
    kernel = sampling_draw._sample_chunk_cut_kernel if cut else sampling_draw._sample_chunk_kernel
    return _compile(kernel, sig, consts, WARPS, 3)


def loop_parts(ins: list[tuple[int, str]]) -> tuple[list[str], list[str] | None]:
    """The step loop's body (the longest backward branch) and the smallest branch in it around 90 %
    of its FFMAs (the logs' polynomials), None if there is none."""
    hi, lo = max(((a, t) for a, t in branches(ins) if t < a), key=lambda b: b[0] - b[1])
    body = [t for a, t in ins if lo <= a <= hi]
    ffma = sum(opcode(t) == "FFMA" for t in body)
    logs = None
    for addr, target in branches(ins):
        if not lo <= addr < target <= hi:  # a forward branch inside the loop
            continue
        region = [t for a, t in ins if addr < a < target]
        holds = sum(opcode(t) == "FFMA" for t in region) >= 0.9 * ffma
        if holds and (logs is None or len(region) < len(logs)):
            logs = region
    return body, logs


def line(screen: int, cut: bool, bf16: bool = False) -> str:
    res, _, ins = disassemble(compile_mode(screen, cut, bf16))
    regs = re.search(r"REG:(\d+)", res)[1]
    body, logs = loop_parts(ins)
    logs = logs if screen else None  # mode 0's branch is the all-greedy skip
    atomics = sum(bool(re.search(r"\b(REDG|ATOMG|RED|ATOM)\b", opcode(t))) for t in body)
    volatile = sum("LDG" in t and ".STRONG.SYS" in t for t in body)
    per = len(body) / PER_THREAD
    if logs is None:
        parts = "logs on every sampled step"
    else:
        rest = (len(body) - len(logs)) / PER_THREAD
        parts = f"logs branch {len(logs) / PER_THREAD:.1f}, rest {rest:.1f}"
    return (
        f"screen {screen}{' cut' if cut else ''}{' bf16' if bf16 else ''}: regs {regs}, "
        f"loop {per:.1f} an element, {parts}; "
        f"atomics {atomics}, volatile loads {volatile}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cut", action="store_true", help="the kernel that applies a filter's cut as it reads")
    ap.add_argument("--bf16", action="store_true", help="bf16 logits (the engine's unfiltered draws)")
    args = ap.parse_args()
    print(f"sampling pass 1, sm_90a, BLOCK {BLOCK}, {WARPS} warps: instructions an element")
    for screen in (0, 1, 2):
        print(line(screen, args.cut, args.bf16))


if __name__ == "__main__":
    main()

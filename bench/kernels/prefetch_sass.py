"""SASS of the L2 prefetches (gptoss.kernels.l2_prefetch), compiled for sm_90a on CPU.

    python bench/kernels/prefetch_sass.py [--json]

No GPU needed (as moe_decode_sass.py). Prints, for the standalone prefetch kernel, its instructions in
order among PREEXIT (griddepcontrol.launch_dependents), UBLKPF (cp.async.bulk.prefetch.L2) and
ACQBULK (griddepcontrol.wait): dependents released first, the wait last. For 120b's decode gate_up
(routing in the kernel) with and without PF: UBLKPF count, registers, and the K loop's instructions,
which the prefetch, issued before the loop, must leave as they are. For decode attention (a full
layer's split, bf16, DECODE_CFG) with and without the "kv" prefetch: its line prefetches (CCTL.E.PF2)
before ACQBULK, and the release (PREEXIT) after it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from attn_sass import compile_decode  # noqa: E402
from moe_decode_sass import _compile, disassemble, mma_loops, opcode  # noqa: E402
from moe_v3_sass import SHAPE, SIG  # noqa: E402

from gptoss.kernels import l2_prefetch, moe_v3_kernels  # noqa: E402
from gptoss.kernels.attention_settings import DECODE_CFG  # noqa: E402
from gptoss.kernels.moe_tiles import _DEC_GU_V3  # noqa: E402

MARKS = ("PREEXIT", "UBLKPF", "ACQBULK")


def standalone() -> dict:
    k = _compile(l2_prefetch._prefetch_kernel, dict(ptr="*bf16", nbytes="i64"), dict(NT=32, PDL=True), 1, 1)
    _, _, ins = disassemble(k)
    return {"order": [op for op in map(opcode, (x for _, x in ins)) if op in MARKS]}


def gate_up(pf: bool) -> dict:
    t = _DEC_GU_V3
    sig = dict(x_ptr="*bf16", act_ptr="*bf16", **SIG, stride_lbp="i32", stride_x="i32")
    sig.update(
        alpha="fp32", limit="fp32", logits_ptr="*fp32", ids_ptr="*i32", wts_ptr="*fp32", stride_l="i32"
    )
    sig.update(w2_ptr="*u8", s2_ptr="*u8", w2_bytes="i64", s2_bytes="i64")
    consts = dict(SHAPE, E=128, BE=128, TOP_K=4, BM=t.bm, BN=t.bn, BK=t.bk, HALF=t.half)
    consts.update(ROUTE=True, KP=4, BT=1, PF=pf, PF_NT=32 * t.warps)
    k = _compile(moe_v3_kernels._gate_up_v3_kernel, sig, consts, t.warps, t.stages)
    _, _, ins = disassemble(k)
    loop = min(mma_loops(ins), key=len)
    return {
        "ublkpf": sum("UBLKPF" in x for _, x in ins),
        "k_loop": len(loop),
        "ublkpf_in_loop": sum("UBLKPF" in x for x in loop),
    }


def attention(pf_keys: int) -> dict:
    _, _, ins = disassemble(compile_decode(False, *DECODE_CFG, pf_keys=pf_keys))
    ops = [opcode(x) for _, x in ins]
    wait = ops.index("ACQBULK")
    pf = [i for i, x in enumerate(x for _, x in ins) if "CCTL.E.PF2" in x]
    return {
        "pf_before_wait": sum(i < wait for i in pf),
        "pf_after_wait": sum(i > wait for i in pf),
        "release_after_wait": ops.index("PREEXIT") > wait,
    }


def report(doc: str, stats: Callable[[], dict]) -> None:
    """A SASS script's main: stats() as one JSON object with --json, else a line a key."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    args = ap.parse_args()
    out = stats()
    if args.json:
        print(json.dumps(out))
        return
    for name, v in out.items():
        print(f"{name}: {v}")


def main() -> None:
    report(
        __doc__,
        lambda: (
            {"standalone": standalone(), "gate_up": gate_up(False), "gate_up_pf": gate_up(True)}
            | {"attn": attention(0), "attn_kv": attention(l2_prefetch.ATTN_KEYS)}
        ),
    )


if __name__ == "__main__":
    main()

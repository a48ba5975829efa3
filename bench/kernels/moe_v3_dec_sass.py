"""SASS statistics of the split-K decode MoE GEMMs (moe_v3_dec_gu's gate_up, moe_v3_dec's down), compiled
for sm_90a on CPU.

    python bench/kernels/moe_v3_dec_sass.py [--tiles BM,BN,BK,SPLIT,WARPS,STAGES[,rNREG] ...] [--cp-async]
        [--ops N] [--unmasked]

No GPU needed (as moe_decode_sass.py): the "v3" layout at the 20b shapes (bf16, E 32, H = I = 2880,
top-4), weights and scales by TMA (the engine's WTMA) unless --cp-async, the counts and row lists
given (a batch past one x tile routes by launch). Each tile shape is compiled for both GEMMs; one line
each: registers, shared memory, spills (in the K loop), the K loop's instructions a weight value, and
the programs an SM can hold (by registers, shared memory and warps), which is what a register cap
(rNREG: ptxas .maxnreg) buys. Without --tiles: the engine's defaults below
moe_v3_dec_sizes.BIG_FROM tokens and from it. --ops N: also the K loop's N most frequent opcodes,
with the dequant's share (IMAD, LOP3, SHF, PRMT and HMUL2: the integer ops and the scale multiply that
turn a word into 4 bf16x2 registers, with the moves ptxas makes IMADs), to tell where a K step's
instructions go (bench/results v61).
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from moe_decode_sass import _compile, disassemble, mma_loops, opcode, stats  # noqa: E402
from moe_v3_sass import _wtma  # noqa: E402

from gptoss.kernels import moe_v3_dec, moe_v3_dec_gu  # noqa: E402
from gptoss.kernels.moe_tiles import DecTiles  # noqa: E402
from gptoss.kernels.moe_v3_dec_sizes import parse_dec_tiles  # noqa: E402

SHAPE = dict(N=2880, K=2880, E=32, BE=32, ASM=True, PREC="tf32", PDL=True)
SIG = dict(w_ptr="*i32", s_ptr="*i32", b_ptr="*fp32", counts_ptr="*i32", rows_ptr="*i32", T="i32")
SIG.update({f"stride_{s}": "i32" for s in ("we", "wn", "se", "sn")})
# H100 / H200 (sm_90): an SM's registers, shared memory (less the 1 KB a block Triton reserves) and warps
SM_REGS, SM_SMEM, SM_WARPS = 65536, 227 * 1024, 64


def _build(kernel, sig: dict[str, str], consts: dict, t: DecTiles, tma: bool):
    """Compile kernel at t; tma: the weights by TMA, in moe_v3.weight_descriptors' blocks of BN rows."""
    if tma:
        w_sig, w_consts = _wtma(t.bn, t)
        sig, consts = sig | w_sig, consts | w_consts
    return _compile(kernel, sig, consts, t.warps, t.stages, t.maxnreg)


def gate_up(t: DecTiles, tma: bool = True):
    sig = dict(x_ptr="*bf16", act_ptr="*bf16", **SIG, stride_x="i32", alpha="fp32", limit="fp32")
    consts = dict(SHAPE, TOP_K=4, BM=t.bm, BN=t.bn, BK=t.bk, SPLIT=t.split)
    return _build(moe_v3_dec_gu._gate_up_v3_dec_kernel, sig, consts, t, tma)


def down(t: DecTiles, tma: bool = True, unmasked: bool = False):
    """unmasked: act rows without a row mask (moe_common.UNMASKED_ROWS; gate_up keeps its mask)."""
    consts = dict(SHAPE, BM=t.bm, BN=t.bn, BK=t.bk, SPLIT=t.split, UNMASKED=unmasked)
    return _build(moe_v3_dec._down_v3_dec_kernel, dict(a_ptr="*bf16", y_ptr="*bf16", **SIG), consts, t, tma)


def programs_an_sm(regs: int, smem: int, warps: int) -> int:
    """Resident programs an SM: registers are allocated per warp in 256-register units."""
    per_warp = -(-regs * 32 // 256) * 256
    return min(SM_REGS // (per_warp * warps), SM_SMEM // max(smem, 1), SM_WARPS // warps)


DEQUANT_OPS = ("IMAD", "LOP3", "SHF", "PRMT", "HMUL2")


def loop_ops(ins: list[tuple[int, str]]) -> collections.Counter:
    """The opcodes of a kernel's K loop (the innermost loop holding its HMMAs; ins: disassemble's
    instructions), counted."""
    return collections.Counter(opcode(x) for x in min(mma_loops(ins), key=len))


def ops_line(ops: collections.Counter, top: int) -> str:
    n = sum(ops.values())
    deq = sum(ops[o] for o in DEQUANT_OPS)
    common = ", ".join(f"{o} {c}" for o, c in ops.most_common(top))
    return f"    K loop {n} ins, dequant {deq} ({deq / n:.0%}): {common}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--tiles", nargs="*", default=[], help="BM,BN,BK,SPLIT,WARPS,STAGES[,rNREG] for both GEMMs"
    )
    ap.add_argument("--cp-async", action="store_true", help="weights by cp.async instead of TMA")
    ap.add_argument("--unmasked", action="store_true", help="the down's act rows without a row mask")
    ap.add_argument("--ops", type=int, default=0, help="also the K loop's N most frequent opcodes")
    args = ap.parse_args()
    try:
        given = [parse_dec_tiles(s, "--tiles") for s in args.tiles]
    except ValueError as e:
        ap.error(str(e))
    gu_tiles = given or [
        moe_v3_dec_gu.V3_GATE_UP_DEC,
        moe_v3_dec_gu.V3_GATE_UP_DEC_BIG,
    ]
    dn_tiles = given or [moe_v3_dec.V3_DOWN_DEC, moe_v3_dec.V3_DOWN_DEC_BIG]
    builds = (("gate_up", gate_up, gu_tiles, {}), ("down", down, dn_tiles, {"unmasked": args.unmasked}))
    for name, build, tiles, options in builds:
        for t in tiles:
            k = build(t, not args.cp_async, **options)
            stats(k, f"{name} {t}")
            res, _, ins = disassemble(k)
            regs = int(res.split("REG:")[1].split()[0])
            print(f"    {programs_an_sm(regs, k.metadata.shared, t.warps)} programs an SM")
            if args.ops:
                print(ops_line(loop_ops(ins), args.ops))


if __name__ == "__main__":
    main()

"""SASS and TTGIR statistics of the v3 MoE GEMMs (moe_v3), compiled for sm_90a on CPU.

    python bench/kernels/moe_v3_sass.py [--gate-up BM,BN,BK,WARPS,STAGES[,half][,rNREG] ...]
        [--down ...] [--wtma] [--unmasked]

No GPU needed (as moe_decode_sass.py): the "v3" layout at the 20b shapes (bf16, E 32, H = I = 2880,
top-4). Per kernel and tiles: registers, shared memory, spills (and those in the K loop), the K
loop's instructions a weight value, and the TTGIR's layout conversions: gate_up's SwiGLU pairs rows
g and g + 8 of its accumulator, which must stay in registers (no convert_layout through shared memory
in the epilogue). --wtma: the weights and scales by TMA (tensor descriptors), as the engine loads
them for tiles of <= 128 rows (GPTOSS_MOE_V3_WTMA=auto); else the cp.async path. --unmasked: x / act
rows loaded without a row mask (moe_common.UNMASKED_ROWS).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from moe_decode_sass import _compile, stats  # noqa: E402

from gptoss.kernels import moe_v3_down, moe_v3_kernels  # noqa: E402
from gptoss.kernels.moe_tiles import _DOWN_TILES_V3, _GATE_UP_TILES_V3, Tiles, parse_tiles_spec  # noqa: E402

SHAPE = dict(N=2880, K=2880, E=32, BE=32, SCALED=True, SWZ=True, PREC="tf32", LORA=False, LW=16)
SIG = dict(w_ptr="*i32", s_ptr="*i32", b_ptr="*fp32", counts_ptr="*i32", rows_ptr="*i32", T="i32")
SIG.update(lb_ptr="*bf16", ls_ptr="*bf16", stride_lbe="i32")
SIG.update({f"stride_{s}": "i32" for s in ("we", "wn", "se", "sn")})


def _wtma(rows: int, t: Tiles) -> tuple[dict[str, str], dict[str, bool]]:
    """The weight and scale descriptors' signature (moe_v3.weight_descriptors' blocks) and WTMA."""
    blocks = f"{rows // 16},{t.bk // 64}"
    sig = dict(w_desc=f"tensordesc<i32[{blocks},128]>", s_desc=f"tensordesc<i32[{blocks},8]>")
    return sig, dict(WTMA=True)


def gate_up(t: Tiles, wtma: bool = False, unmasked: bool = False):
    sig = dict(x_ptr="*bf16", act_ptr="*bf16", **SIG, stride_lbp="i32", stride_x="i32")
    sig.update(alpha="fp32", limit="fp32")
    consts = dict(SHAPE, TOP_K=4, BM=t.bm, BN=t.bn, BK=t.bk, HALF=t.half, UNMASKED=unmasked)
    if wtma:  # gate_up's BN counts act columns: two weight rows each
        w_sig, w_consts = _wtma(2 * t.bn, t)
        sig.update(w_sig)
        consts.update(w_consts)
    return _compile(moe_v3_kernels._gate_up_v3_kernel, sig, consts, t.warps, t.stages, t.maxnreg)


def down(t: Tiles, wtma: bool = False, unmasked: bool = False):
    sig = dict(a_ptr="*bf16", y_ptr="*bf16", **SIG)
    consts = dict(SHAPE, BM=t.bm, BN=t.bn, BK=t.bk, HALF=t.half, UNMASKED=unmasked)
    if wtma:
        w_sig, w_consts = _wtma(t.bn, t)
        sig.update(w_sig)
        consts.update(w_consts)
    return _compile(moe_v3_down._down_v3_kernel, sig, consts, t.warps, t.stages, t.maxnreg)


def ttgir(k) -> str:
    ir = k.asm["ttgir"]
    n = {op: len(re.findall(rf"\bttg\.{op}\b", ir)) for op in ("convert_layout", "local_alloc")}
    return f"    ttgir: {n['convert_layout']} convert_layout, {n['local_alloc']} local_alloc"


def parse(spec: str) -> Tiles:
    """BM,BN,BK,WARPS,STAGES[,half][,rNREG], as GPTOSS_MOE_V3_TILES spells tiles."""
    t = parse_tiles_spec(spec)
    if t is None:
        raise ValueError(f"{spec!r}: not BM,BN,BK,WARPS,STAGES[,half][,rNREG] (a register cap 64-255)")
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--gate-up", nargs="*", default=[], help="extra gate_up tiles BM,BN,BK,WARPS,STAGES[,half][,rNREG]"
    )
    ap.add_argument("--down", nargs="*", default=[], help="extra down tiles")
    ap.add_argument("--wtma", action="store_true", help="weights and scales by TMA, as the engine's")
    ap.add_argument("--unmasked", action="store_true", help="x / act rows without a row mask")
    args = ap.parse_args()
    for t in [*dict.fromkeys(_GATE_UP_TILES_V3.values()), *map(parse, args.gate_up)]:
        k = gate_up(t, args.wtma, args.unmasked)
        stats(k, f"gate_up {t}")
        print(ttgir(k))
    for t in [*dict.fromkeys(_DOWN_TILES_V3.values()), *map(parse, args.down)]:
        k = down(t, args.wtma, args.unmasked)
        stats(k, f"down {t}")
        print(ttgir(k))


if __name__ == "__main__":
    main()

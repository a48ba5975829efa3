"""The decode-path variants bench/kernels/moe_gpu.py times (DecVariant, DEC_VARIANTS): the tiles,
flat grids and timing probes of gptoss.kernels.moe_decode's expert-slot kernels, with why each
exists. The M-tile variants are moe_variants'."""

from __future__ import annotations

from dataclasses import dataclass, replace

from gptoss.kernels.moe_tiles import DOWN_DEC_TILES, GATE_UP_DEC_TILES, DecTiles


# The decode path (gptoss.kernels.moe_decode: router, expert-slot GEMMs, moe.combine) for
# M <= MAX_T; "dec" is the module's defaults, the others change one thing. The other variants run
# with moe_decode.ENABLED = False, so "v2" stays the M-tile path at every M. Their rows: gate_up_us /
# down_us as above (down_us: y per slot, without the combine), router_us the router alone
# (F.linear + route_and_group). E.g. --no-vllm --ms 1,2,4,8,16 --variants v2,dec,dec-dn16,dec-gu32
@dataclass(frozen=True, slots=True)
class DecVariant:
    gate_up: DecTiles | None = None  # None: moe_tiles.GATE_UP_DEC_TILES
    down: DecTiles | None = None  # None: moe_tiles.DOWN_DEC_TILES
    max_m: int = 16
    probe: int = 0  # moe_decode.PROBE: 1 the slot kernels' load path alone, 2 their compute alone


DEC_VARIANTS: dict[str, DecVariant] = {
    "dec": DecVariant(),
    "dec-dn16": DecVariant(down=DecTiles(8, 16, 1024, 8, 8, 3)),  # BN 16: twice the programs
    "dec-gu32": DecVariant(gate_up=DecTiles(8, 32, 512, 4, 4, 3)),  # 2.8 ins/value, 218 regs
    # T = 1 runs 4 x 2880 / BN gate_up programs, ~4 an SM resident (528): 720 at BN 16 is 1.36 waves
    "dec-gu8": DecVariant(gate_up=DecTiles(8, 8, 512, 4, 4, 4)),  # 1440 programs: 2.7 waves, finer tail
    "dec-gu16s3": DecVariant(gate_up=DecTiles(8, 16, 512, 4, 4, 3)),  # less shared memory: more resident
    "dec-gu16k1k": DecVariant(gate_up=DecTiles(8, 16, 1024, 8, 8, 3)),  # 8 warps a program, half the steps
    "dec-dn32s4": DecVariant(down=DecTiles(8, 32, 512, 4, 4, 4)),  # a stage deeper
}
# The flat kernels (moe_decode_flat): both GEMMs on a fixed grid of P programs an SM, each program's
# items (expert, column block) in one pipelined loop; GPTOSS_MOE_FLAT=P in the engine.
DEC_VARIANTS["slot"] = DecVariant(gate_up=GATE_UP_DEC_TILES, down=DOWN_DEC_TILES)  # never flat
for _p in (1, 2, 3, 4, 6):
    DEC_VARIANTS[f"flat{_p}"] = DecVariant(
        gate_up=replace(GATE_UP_DEC_TILES, per_sm=_p), down=replace(DOWN_DEC_TILES, per_sm=_p)
    )
# Fewer programs an SM leave shared memory for deeper pipelines.
DEC_VARIANTS["flat2-s6"] = DecVariant(
    gate_up=replace(GATE_UP_DEC_TILES, per_sm=2, stages=6), down=replace(DOWN_DEC_TILES, per_sm=2, stages=6)
)
DEC_VARIANTS["flat1-s8"] = DecVariant(
    gate_up=replace(GATE_UP_DEC_TILES, per_sm=1, stages=8), down=replace(DOWN_DEC_TILES, per_sm=1, stages=8)
)
# Where a decode K step's time goes (slot kernels, timing probes; moe_v2_step PROBE): the loads and
# MMAs without the dequant arithmetic, and the dequant and MMAs on a pattern without weight loads
# (sm_90a: 174 and 440 loop instructions against 383; the compute probe's pattern costs ~15 %).
DEC_VARIANTS["probe-loads"] = DecVariant(gate_up=GATE_UP_DEC_TILES, down=DOWN_DEC_TILES, probe=1)
DEC_VARIANTS["probe-compute"] = DecVariant(gate_up=GATE_UP_DEC_TILES, down=DOWN_DEC_TILES, probe=2)
# gpt-oss-120b's Offline decode (--experts 128, M 256-2048): every expert hit by ~8-64 rows, so a
# step streams all 128 experts' weights (1.69 GB a layer) and v2's 32-row tiles run at ~34 % of HBM
# (v11). The decode kernels stream at ~55-60 % at 16-27 hit experts (M 8-16, 20b); here with BM 16
# or 32 (BM 8 loops an expert's rows, dequantizing its weights again each 8). max_m lets them run
# past MAX_T (moe_gpu's _dec_switches).
_ROWS = {
    "d8": (DecTiles(8, 16, 512, 4, 4, 4), DecTiles(8, 32, 512, 4, 4, 3)),
    "d16": (DecTiles(16, 16, 512, 4, 4, 3), DecTiles(16, 32, 512, 4, 4, 3)),
    "d32": (DecTiles(32, 16, 256, 2, 2, 3), DecTiles(32, 32, 256, 2, 2, 3)),
    "d32k512": (DecTiles(32, 16, 512, 4, 4, 2), DecTiles(32, 32, 512, 4, 4, 2)),
}
for _n, (_gu, _dn) in _ROWS.items():
    for _p in (0, 2, 4):
        DEC_VARIANTS[f"rows-{_n}{f'-flat{_p}' if _p else ''}"] = DecVariant(
            gate_up=replace(_gu, per_sm=_p), down=replace(_dn, per_sm=_p), max_m=2048
        )

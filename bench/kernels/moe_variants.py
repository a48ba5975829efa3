"""The variants bench/kernels/moe_gpu.py times: kernel family, layout and tile overrides of the M-tile
MoE (VARIANTS of moe_variant.Variant), with why each exists. Decode batches on the v3 kernels are
moe_v3_dec_variants', the v2 decode path's moe_dec_variants'."""

from __future__ import annotations

from dataclasses import replace

from moe_v3_dec_variants import V3_DEC_VARIANTS
from moe_variant import Variant

from gptoss.kernels.moe import Tiles
from gptoss.kernels.moe_tiles import NARROW_V3

DECODE = 64  # M <= 64: BM 16 at E 32, top-4


def _both(bucket: int, t: Tiles) -> dict[tuple[int, bool], Tiles]:
    """The same tiles for gate_up and down at one M bucket."""
    return {(bucket, True): t, (bucket, False): t}


VARIANTS: dict[str, Variant] = {
    "v1": Variant("v1"),
    "v2": Variant("v2"),
    "v2-noasm": Variant("v2", asm=False),
    "v2-2d": Variant(
        "v2",
        tiles=_both(16, Tiles(16, 32, 256, 2, 4)),
        max_m=DECODE,
    ),
    "v2-bn16": Variant(
        "v2",
        tiles=_both(16, Tiles(16, 16, 512, 4, 3, 4)),
        max_m=DECODE,
    ),
    "v2-bn64": Variant(
        "v2",
        tiles=_both(16, Tiles(16, 64, 512, 4, 3, 4)),
        max_m=DECODE,
    ),
    "v2-s2": Variant(
        "v2",
        tiles=_both(16, Tiles(16, 32, 256, 2, 4, 2)),
        max_m=DECODE,
    ),
    "v2-b32-s2": Variant(
        "v2",
        tiles=_both(32, Tiles(32, 32, 256, 2, 3, 2)),
        min_m=129,
        max_m=256,
    ),
    "v2-b32-wg": Variant(
        "v2",
        tiles=_both(32, Tiles(32, 64, 128, 4, 3)),
        min_m=129,
        max_m=256,
    ),
    "v2-bm64": Variant(
        "v2",
        tiles={(128, True): Tiles(64, 128, 128, 8, 3), (128, False): Tiles(64, 64, 128, 4, 3)},
        min_m=1024,
    ),
}


def _sweep(name: str, bucket: int, gu: Tiles, dn: Tiles, min_m: int, max_m: int) -> None:
    VARIANTS[name] = Variant("v2", tiles={(bucket, True): gu, (bucket, False): dn}, min_m=min_m, max_m=max_m)


# Tile sweeps, one bucket each (bucket = rows an expert gets: 16 for M <= 64, 32 for M 128-256,
# 64 for M 512, 128 past): "xa" puts x as the wgmma A operand and the dequantized weights in shared
# memory as B, so the MMA of one K step runs under the next step's dequant.
for _bn, _bk, _w, _st, _sp in [
    (16, 512, 4, 3, 4),
    (32, 512, 4, 4, 4),
    (32, 1024, 8, 2, 8),
    (64, 512, 8, 3, 4),
    (32, 256, 4, 4, 2),
]:
    _t = Tiles(16, _bn, _bk, _w, _st, _sp)
    _sweep(f"d16-{_bn}-{_bk}-w{_w}-s{_st}-k{_sp}", 16, _t, _t, 0, DECODE)
for _t in [
    Tiles(32, 32, 512, 4, 4, 4),
    Tiles(32, 64, 512, 8, 3, 4),
    Tiles(32, 64, 128, 4, 3, xa=True),
    Tiles(32, 128, 128, 4, 3, xa=True),
    Tiles(32, 32, 1024, 8, 2, 8),
]:
    _sweep(
        f"d32-{_t.bn}-{_t.bk}-w{_t.warps}-s{_t.stages}-k{_t.split}{'-xa' if _t.xa else ''}",
        32,
        _t,
        _t,
        129,
        256,
    )
for _t in [
    Tiles(64, 64, 128, 4, 3, xa=True),
    Tiles(64, 128, 128, 8, 3),
    Tiles(64, 128, 128, 4, 3, xa=True),
    Tiles(64, 32, 512, 4, 3, 4),
]:
    _sweep(
        f"d64-{_t.bn}-{_t.bk}-w{_t.warps}-s{_t.stages}-k{_t.split}{'-xa' if _t.xa else ''}",
        64,
        _t,
        _t,
        257,
        512,
    )
for _b, _lo, _hi in [(32, 129, 256), (64, 257, 512), (128, 1024, 4096)]:
    for _t in [
        Tiles(32, 64, 128, 4, 3, xa=True),
        Tiles(32, 64, 128, 4, 4, xa=True),
        Tiles(32, 64, 256, 4, 3, xa=True),
        Tiles(32, 128, 128, 4, 2, xa=True),
        Tiles(16, 64, 128, 4, 3, xa=True),
    ]:
        _sweep(f"b{_b}-{_t.bm}x{_t.bn}-{_t.bk}-s{_t.stages}-xa", _b, _t, _t, _lo, _hi)
for _gu, _dn in [
    (Tiles(128, 128, 128, 8, 3, xa=True), Tiles(128, 128, 128, 8, 3, xa=True)),
    (Tiles(128, 128, 128, 8, 2), Tiles(128, 128, 128, 8, 2)),
    (Tiles(128, 64, 128, 8, 3), Tiles(128, 64, 128, 8, 3)),
    (Tiles(128, 64, 128, 8, 3, xa=True), Tiles(128, 64, 128, 8, 3, xa=True)),
    (Tiles(128, 128, 128, 8, 3), Tiles(256, 128, 128, 8, 2)),
]:
    _sweep(
        f"p128-{_gu.bm}x{_gu.bn}-{_dn.bm}x{_dn.bn}-w8-s{_gu.stages}{'-xa' if _gu.xa else ''}",
        128,
        _gu,
        _dn,
        1024,
        1 << 30,
    )


# gpt-oss-120b (moe_gpu.py --experts 128): Offline decode batches of ~1024 give 32 rows an expert
# (bucket 32; 64 at M 2048), where the v2 GEMMs took 84 % of a 120b step on the H200 (bench/results
# 2026-11-23 v11 profile). The same tile for gate_up and down, both buckets.
for _t in [
    Tiles(32, 64, 128, 4, 4, xa=True),
    Tiles(32, 128, 128, 4, 3, xa=True),
    Tiles(32, 64, 256, 4, 3, xa=True),
    Tiles(32, 64, 128, 4, 3),
    Tiles(32, 128, 128, 8, 3),
    Tiles(32, 32, 512, 4, 3, 4),
    Tiles(32, 64, 512, 8, 3, 4),
]:
    VARIANTS[f"e128-{_t.bn}-{_t.bk}-w{_t.warps}-s{_t.stages}-k{_t.split}{'-xa' if _t.xa else ''}"] = Variant(
        "v2", tiles={**_both(32, _t), **_both(64, _t)}, min_m=513, max_m=2048
    )


# v3 (gptoss.kernels.moe_v3): "v3" its table (moe_tiles._GATE_UP_TILES_V3 / _DOWN_TILES_V3) on
# weights in the v3 layout (MMA lane fragments); "v3ds" the same table on checkpoint-order weights
# through tl.dot_scaled (the simplest version, for comparison); "dual" the engine's setup on 20b
# (v2 weights plus a v3 copy, prepare_moe_weights(large="v3"): v3 from moe_layout.LARGE_MIN_ROWS
# rows an expert, M >= 17 since v21); the rest override v3 buckets (TILE_OVERRIDE, which choose_tiles_v3
# reads too). v3 buckets: M 256 is 32, M 512 64, M 1024-4088 128, M >= 4096 512. Round 1's winners
# (v3-k64's gate_up, v3-bm256's down) are the table now; its losers (v3-s4, v3-dn128, v3-bm64,
# v3-b32-n128, v3-b32-k256) are gone. In the sm_90a SASS (20b shapes): gate_up 128x256 BK 64
# spills 64 STL + 64 LDL a K step (timed anyway: one more warpgroup's worth of x reuse); gate_up
# 256x128 spills 128 + 128 (not offered); the b32/b64 tiles below use <= 130 registers, no spills.
def _v3_tiles(gu: Tiles | None, dn: Tiles | None, buckets=(128, 512)) -> dict[tuple[int, bool], Tiles]:
    """TILE_OVERRIDE entries setting gate_up's and down's tiles at the buckets (None: the table's)."""
    return {(b, g): t for b in buckets for g, t in ((True, gu), (False, dn)) if t is not None}


VARIANTS["v3"] = Variant("v3")
VARIANTS["v3-tma"] = Variant("v3", tma="down")  # GPTOSS_MOE_V3_TMA=down
VARIANTS["v3-tma-all"] = Variant("v3", tma="all")  # GPTOSS_MOE_V3_TMA=all
# Weights by TMA (GPTOSS_MOE_V3_WTMA=1): one copy a K step instead of a 16-byte cp.async a lane; with
# x's rows by TMA too (-all); and 6 stages deep at the few-rows buckets 16 and 32 (120b's decode
# batches of ~250-1000 tokens), which TMA's lighter issue might feed (sm_90a: 99 / 147 KB of shared
# memory).
VARIANTS["v3-w"] = Variant("v3", wtma=True)
VARIANTS["v3-w-all"] = Variant("v3", tma="all", wtma=True)
VARIANTS["v3-w-x"] = Variant("v3", tma="x", wtma=True)  # gate_up's x alone by TMA (GPTOSS_MOE_V3_TMA=x)
VARIANTS["v3-w-s6"] = Variant(
    "v3",
    wtma=True,
    tiles={
        **{(b, True): Tiles(2 * b, 64, 128, 4, 6, half=True) for b in (16, 32)},
        **{(b, False): Tiles(2 * b, 128, 128, 4, 6, half=True) for b in (16, 32)},
    },
)
VARIANTS["v3ds"] = Variant("v3ds")
VARIANTS["dual"] = Variant("dual")
# What the engine runs on 20b: two copies (v2, v3), every switch at its default. Before 2026-12-02 this
# was Variant("dual", decode=True), whose switches differed from the engine's since v29-v40: v3's
# weights on cp.async (the engine: TMA at tiles of <= 128 rows), and batch 1 on v2's decode kernels
# through moe_forward (the engine: v3's split-K kernels, the gate_up routing the logits).
VARIANTS["engine"] = Variant("dual", engine=True)
# The engine with the v3 GEMMs' x / act loads unmasked by row (moe_common.UNMASKED_ROWS): the same bits,
# shorter K loops in the sm_90a SASS (bench/results v74), untimed
VARIANTS["engine-unmasked"] = Variant("dual", engine=True, unmasked=True)
VARIANTS["v3-unmasked"] = Variant("v3", unmasked=True)
# BK 128 on the BM-256 tiles (buckets 128 and 512): 135 instructions a 64-K step unmasked against the
# default's 172 in the sm_90a SASS (v74); v19 timed it masked and slower, before v20 moved the loads.
_K128 = _v3_tiles(Tiles(256, 64, 128, 8, 3, half=True), Tiles(256, 128, 128, 8, 3, half=True))
VARIANTS["L-k128"] = Variant("v3", tiles=_K128, min_m=513)
VARIANTS["L-k128-unmasked"] = Variant("v3", tiles=_K128, min_m=513, unmasked=True)
for _name, _buckets, _gu, _dn, _lo, _hi in [
    ("v3-gu128x256", (128, 512), Tiles(128, 256, 64, 8, 3), None, 1024, 1 << 30),
    ("v3-b32-k64s6", (32,), Tiles(32, 64, 64, 4, 6), Tiles(32, 64, 64, 4, 6), 129, 256),
    ("v3-b64-k64", (64,), Tiles(64, 128, 64, 8, 4), Tiles(64, 128, 64, 8, 4), 257, 512),
]:
    VARIANTS[_name] = Variant("v3", tiles=_v3_tiles(_gu, _dn, _buckets), min_m=_lo, max_m=_hi)

# BM-256 tiles (gate_up on its interleaved rows: 128 weight rows a program, one dot), "h": tiles of
# <= 128 rows on the BM-128 body (Tiles.half; "v3-256h" was the table 2026-11-26, 4 stages deep at
# bucket 128 since 2026-11-27). Bucket 128
# (M 513-4088 at 20b) and 512 (M >= 4096). "v3-128" the tiles before it (moe_tiles.NARROW_V3).
_GU256, _DN256 = Tiles(256, 64, 64, 8, 3), Tiles(256, 128, 64, 8, 3)
_half = lambda t: Tiles(t.bm, t.bn, t.bk, t.warps, t.stages, half=True)  # noqa: E731
for _name, _gu, _dn in [
    ("v3-256", _GU256, _DN256),
    ("v3-256h", _half(_GU256), _half(_DN256)),
    ("v3-256h-gu", _half(_GU256), None),
    ("v3-128h", Tiles(128, 128, 64, 8, 4, half=True), Tiles(128, 256, 64, 8, 4, half=True)),
]:
    VARIANTS[_name] = Variant("v3", tiles=_v3_tiles(_gu, _dn), min_m=513)
VARIANTS["v3-128"] = Variant("v3", tiles=NARROW_V3, min_m=513)

# Large-M candidates (2026-11-27), one GEMM changed each ("gu"/"dn"; the other keeps the table's):
# matmul_ogs' Hopper shape is 256 weight rows x 128 tokens at BK 128, 4 stages. In the sm_90a SASS
# the K loop of a 256-row BK-128 tile issues 3.33 instructions a weight value, the table's 128-row
# BK-64 tiles 5.50 (its fixed per-step work, the x tile's copies and the waits, over half the
# values): at ~125 rows an expert (Offline decode, M ~1000) the table's tiles run their 128-token
# body, so each weight value feeds as many MMAs as in the 256-row tile but costs 1.65x the issue.
# Measured (H100, v19): the 256-row tiles 1.7-2.2x slower, their dequant waiting on the wgmmas that
# hold its registers; "L-gu256k64s4" / "L-dn256k64s4" (4 stages) won and are bucket 128's table now.
for _name, _gu, _dn in [
    ("L-gu128k128s4", Tiles(128, 128, 128, 8, 4, half=True), None),
    ("L-gu128k128s3", Tiles(128, 128, 128, 8, 3, half=True), None),
    ("L-gu128k64s4", Tiles(128, 128, 64, 8, 4, half=True), None),
    ("L-gu256k128s3", Tiles(256, 64, 128, 8, 3, half=True), None),
    ("L-gu256k64s4", Tiles(256, 64, 64, 8, 4, half=True), None),
    ("L-dn128k64s4", None, Tiles(128, 256, 64, 8, 4, half=True)),
    ("L-dn128k128s3", None, Tiles(128, 256, 128, 8, 3, half=True)),  # spills 28 outside the K loop
    ("L-dn256k128s2", None, Tiles(256, 128, 128, 8, 2, half=True)),
    ("L-dn256k64s4", None, Tiles(256, 128, 64, 8, 4, half=True)),
]:
    VARIANTS[_name] = Variant("v3", tiles=_v3_tiles(_gu, _dn), min_m=513)

# Round 2 (same day): the 8-warp tiles hold all 255 registers, one program an SM, so nothing overlaps
# a program's barriers, waits and epilogue. 4-warp tiles of half the weight rows (254 or 128
# registers, 102 or 54 KB of stages): 2 or 4 programs an SM. "W-s5": the table's, 5 stages deep.
for _name, _gu, _dn in [
    ("W-4w256", Tiles(256, 32, 64, 4, 3, half=True), Tiles(256, 64, 64, 4, 3, half=True)),
    ("W-4w128", Tiles(128, 32, 64, 4, 3, half=True), Tiles(128, 64, 64, 4, 3, half=True)),
    ("W-4w128s4", Tiles(128, 32, 64, 4, 4), Tiles(128, 64, 64, 4, 4)),
    ("W-4w256k128", Tiles(256, 32, 128, 4, 2, half=True), Tiles(256, 64, 128, 4, 2, half=True)),
    ("W-s5", Tiles(256, 64, 64, 8, 5, half=True), Tiles(256, 128, 64, 8, 5, half=True)),
]:
    VARIANTS[_name] = Variant("v3", tiles=_v3_tiles(_gu, _dn), min_m=513)


# Few rows an expert (2026-11-27, v21): 120b's Offline decode steps (M 500-1000 over 128 experts:
# 16-31 rows an expert) and 20b at M 64-512 run the v2 kernels at 27-34 % of HBM (the H200 120b
# profile, v21). Candidates on the v3 kernels for buckets 16, 32 and 64, all three at once:
# "h": BM twice the bucket on a BM/2 body (Tiles.half), so an expert that gets more than the mean
# (random routing: ~45 % of them at bucket 16) still streams its weights once, not twice;
# 128 / 256: weight rows a program (gate_up's BN counts act columns, two weight rows each): one
# warpgroup per 64, or "4w" four warps over all 256 (sm_90a: 2.7 instructions a weight value, ~245
# registers; 3.1-3.3 for the others, no spills); 256 rows read each x tile for twice the weights
# (matmul_ogs' Hopper shape is 256 weight rows, BK 128, BM = the rows an expert rounded up).
def _few(gu, dn, buckets=(16, 32, 64)) -> dict[tuple[int, bool], Tiles]:
    """TILE_OVERRIDE entries: gu(bucket) / dn(bucket) -> the tiles of that bucket."""
    return {(b, g): f(b) for b in buckets for g, f in ((True, gu), (False, dn))}


for _name, _gu, _dn, _buckets in [
    (
        "S-h128",
        lambda b: Tiles(2 * b, 64, 128, 4, 4, half=True),
        lambda b: Tiles(2 * b, 128, 128, 4, 4, half=True),
        (16, 32, 64),
    ),
    (
        "S-h256",
        lambda b: Tiles(2 * b, 128, 128, 8, 4, half=True),
        lambda b: Tiles(2 * b, 256, 128, 8, 4 if b < 64 else 3, half=True),
        (16, 32, 64),
    ),
    (
        "S-h256k64",
        lambda b: Tiles(2 * b, 128, 64, 8, 6, half=True),
        lambda b: Tiles(2 * b, 256, 64, 8, 6, half=True),
        (16, 32, 64),
    ),
    ("S-256", lambda b: Tiles(b, 128, 128, 8, 4), lambda b: Tiles(b, 256, 128, 8, 4), (16, 32, 64)),
    (
        "S-4w256",
        lambda b: Tiles(2 * b, 128, 128, 4, 3, half=True),
        lambda b: Tiles(2 * b, 256, 128, 4, 3, half=True),
        (16,),  # at BM 64 it spills 101-171 registers
    ),
]:
    VARIANTS[_name] = Variant("v3", tiles=_few(_gu, _dn, _buckets), max_m=2048)
# S-h256k64's downs at BM 64 and 128 (BK 64, half) race on the cp.async path, which down_v3 refuses
# (moe_v3.racy_pointer_down): the whole default table stopped there at M 256-512 (bench/results v43).
# By TMA they give one output a input.
VARIANTS["S-h256k64"] = replace(VARIANTS["S-h256k64"], wtma=True)
# The few-rows tiles with their weights by TMA, as the engine loads them (GPTOSS_MOE_V3_WTMA=auto:
# tiles of <= 128 rows); S-h128-w is the engine's tiles at buckets 16-32 until v46 (4 stages, uncapped).
VARIANTS["S-h128-w"] = replace(VARIANTS["S-h128"], wtma=True)
VARIANTS["S-h256-w"] = replace(VARIANTS["S-h256"], wtma=True)
# S-h256k64's tiles at bucket 64 only (20b's M 257-512, 120b's 1025-2048), by TMA: its bucket-32
# tiles gave other bits (moe_tiles' note), so only bucket 64's are candidates for the table.
VARIANTS["S-b64k64"] = Variant(
    "v3",
    tiles=_few(
        lambda b: Tiles(2 * b, 128, 64, 8, 6, half=True),
        lambda b: Tiles(2 * b, 256, 64, 8, 6, half=True),
        (64,),
    ),
    max_m=2048,
    wtma=True,
)

# S-h128's one warpgroup over 128 / 256 weight rows at BK 64, buckets 16 and 32 (120b's Offline decode
# steps, M ~500-1000: ~16-31 rows an expert), by TMA (their downs race on cp.async, racy_pointer_down).
# Why (bench/results v45): at 120b's M 664 the table's bucket-32 tiles (BK 128, 4 stages: 190 and 192
# registers, 92 KB of shared memory: sm_90a with the weights by TMA, `moe_v3_sass.py --wtma` on CPU)
# fit 2 programs an SM; Nsight Compute had gate_up and down at 41 / 40 % of DRAM, issuing 50 / 47 %
# of cycles, 12.4 % occupancy, their warps stalled on fixed-latency dependencies (wait, 21-22 % of
# samples) with 2 warps a scheduler. At BK 64: 126 / 148 registers, 71 KB at 6 stages (3 programs an
# SM), 46 KB at 4; but 3.98 instructions a weight value in the K loop against 3.38.
for _name, _stages in [("S-h128k64", 6), ("S-h128k64s4", 4)]:
    VARIANTS[_name] = Variant(
        "v3",
        tiles=_few(
            lambda b, s=_stages: Tiles(2 * b, 64, 64, 4, s, half=True),
            lambda b, s=_stages: Tiles(2 * b, 128, 64, 4, s, half=True),
            (16, 32),
        ),
        max_m=1024,
        wtma=True,
    )


# The BK-128 tiles (the table's until v46) at 3 stages under a register cap (Tiles.maxnreg), for the
# same occupancy without the BK-64 loop's extra instructions: bucket 32 at 168 registers (66.6 KB,
# 3 programs an SM; 190 / 192 uncapped, 2), bucket 16 at 128 (42 KB, 4 an SM; 131 / 143, 3). sm_90a
# with TMA weights: no spill in the K loop, 3.25-3.38 instructions a weight value as uncapped; 2-20
# spills outside it.
# The table's at buckets 16 and 32 since v46 (M 664 at 120b's shapes: 861.8 -> 782.9 us).
def _capped(caps: dict[int, tuple[int, int]]) -> Variant:
    """S-h128's BK-128 tiles by TMA at each bucket b of caps -> (register cap, stages)."""
    return Variant(
        "v3",
        tiles=_few(
            lambda b: Tiles(2 * b, 64, 128, 4, caps[b][1], half=True, maxnreg=caps[b][0]),
            lambda b: Tiles(2 * b, 128, 128, 4, caps[b][1], half=True, maxnreg=caps[b][0]),
            tuple(caps),
        ),
        max_m=1024,
        wtma=True,
    )


VARIANTS["S-h128s3r"] = _capped({16: (128, 3), 32: (168, 3)})

# One program more an SM than S-h128s3r (the table's since v46, whose 3 programs an SM ran bucket 32
# 9 % faster than 2): bucket 16 at 96 registers (42 KB at 3 stages: 5 an SM), bucket 32 at 128 and 2
# stages (41.5 KB: 4 an SM). sm_90a with TMA weights (`moe_v3_sass.py --wtma`, CPU, 2026-12-02): no
# spill in the K loop (bucket 32: 14-16 outside it), 3.34-3.44 / 3.52-3.55 instructions a weight value
# against 3.25-3.38; the bits in test_v3_few_rows_tiles_on_gpu.
VARIANTS["S-h128occ"] = _capped({16: (96, 3), 32: (128, 2)})

# The same question on v2, which has no half body: each bucket on the next bucket's BM (so an expert
# above the mean rows, ~45 % of them at a bucket's mean, still takes one tile, at the cost of a
# wider MMA). The v21 profile hints at it: 120b's step at 122 rows (3.8 an expert, one tile each)
# took ~33 ms against 68.8 at 500 rows (15.6 an expert: bucket 16, a second BM-16 tile for ~42 % of
# the experts), for the same 61 GB of weights.
VARIANTS["v2-up"] = Variant(
    "v2",
    tiles={
        **_both(16, Tiles(32, 64, 128, 4, 3, xa=True)),
        **_both(32, Tiles(64, 64, 128, 4, 3, xa=True)),
        **_both(64, Tiles(128, 128, 128, 8, 3)),
    },
    max_m=2048,
)
VARIANTS.update(V3_DEC_VARIANTS)

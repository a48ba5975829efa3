"""bench/kernels/moe_gpu.py's variants of decode batches (T <= 16 tokens) on the v3 kernels: the v3
tiles' decode bucket (D-*) and the split-K slot kernels (v3-dd*), with why each exists; moe_variants
adds them to VARIANTS."""

from __future__ import annotations

from moe_variant import Variant

from gptoss.kernels.moe import Tiles
from gptoss.kernels.moe_tiles import DECODE_BUCKET, DecTiles

V3_DEC_VARIANTS: dict[str, Variant] = {}


# Decode batches on the v3 kernels (T <= 16 tokens: moe_tiles.DECODE_BUCKET, since v23): 120b runs
# every batch on its one v3 copy, so batch 1 takes these (the v2 decode kernels: DEC_VARIANTS
# "slot"). "v3" is the table's (64 weight rows, BK 128, 4 stages); "D-old" bucket 16's tiles, which
# these batches took before v23 (128 weight rows: 180 gate_up and 92 down programs at T 1). A down
# tile needs 64 weight rows (BN 64): at 32 its bits differ (moe_v3 tests).
def _dec(gu: Tiles, dn: Tiles) -> dict[tuple[int, bool], Tiles]:
    return {(DECODE_BUCKET, True): gu, (DECODE_BUCKET, False): dn}


for _name, _gu, _dn in [
    ("D-old", Tiles(32, 64, 128, 4, 4, half=True), Tiles(32, 128, 128, 4, 4, half=True)),
    ("D-64k128s6", Tiles(16, 32, 128, 4, 6), Tiles(16, 64, 128, 4, 6)),
    ("D-64k256s4", Tiles(16, 32, 256, 4, 4), Tiles(16, 64, 256, 4, 4)),  # twice the bytes a stage
    ("D-64k64s8", Tiles(16, 32, 64, 4, 8), Tiles(16, 64, 64, 4, 8)),
    ("D-128k64s8", Tiles(16, 64, 64, 4, 8), Tiles(16, 64, 64, 4, 8)),  # gate_up on 128 weight rows
    ("D-128k128s6", Tiles(16, 64, 128, 4, 6), Tiles(16, 128, 128, 4, 6)),  # half the programs
    # down on 32 weight rows (mma.sync, 2 warps): twice the programs (360 at T 1) as v2's decode down,
    # which beats v3's at batch 1 (10.7 against 16.8 us a layer, v23); its bits differ from the
    # other buckets'. Measured v24: ~2x slower at every M (down alone at M 1 41.5 against 21.2 us);
    # the split-K kernel over the same words (v3-dd below) is what won
    ("D-dn32", Tiles(16, 32, 128, 4, 4), Tiles(16, 32, 128, 2, 4)),
    ("D-dn32k256", Tiles(16, 32, 128, 4, 4), Tiles(16, 32, 256, 2, 4)),
]:
    V3_DEC_VARIANTS[_name] = Variant("v3", tiles=_dec(_gu, _dn), max_m=16)

# Decode batches' down on the v3 weights as v2's decode down runs (moe_v3_dec; the engine's at T 1
# since v24, GPTOSS_V3_DEC_DOWN; "v3" here is the table's tiles at every M, these at every M <= 16):
# a program per (32 weight rows, expert with rows), each K step of 512 split over 4 warps (a batched
# dot): twice the programs of v3's down at T 1 and 4 warps dequantizing at once. v23: v3's down 16.8
# us a layer at batch 1 against v2's decode down 10.7 (same bytes). -k1024: BK 1024 (8 KB of
# weights a warp a step); -s4: 4 stages.
V3_DEC_VARIANTS["v3-dd"] = Variant("v3", max_m=16, v3_dec_down=DecTiles(16, 32, 512, 4, 4, 3))
V3_DEC_VARIANTS["v3-dd-s4"] = Variant("v3", max_m=16, v3_dec_down=DecTiles(16, 32, 512, 4, 4, 4))
V3_DEC_VARIANTS["v3-dd-k1024"] = Variant("v3", max_m=16, v3_dec_down=DecTiles(16, 32, 1024, 4, 4, 3))
# The engine's batch-1 MoE (v3-dd) with every weight by TMA: the gate_up's (GPTOSS_MOE_V3_WTMA's
# default) and the split-K down's (GPTOSS_V3_DEC_WTMA=1; sm_90a: 6 UTMALDG.3D for 12 LDGSTS.128 a
# K loop, 368 -> 388 instructions, no added layout conversion); v3-dd is the same on cp.async.
V3_DEC_VARIANTS["v3-dd-w"] = Variant("v3", max_m=16, v3_dec_down=DecTiles(16, 32, 512, 4, 4, 3), wtma=True)
# The same with the gate_up's decode tiles (64 weight rows, BK 128) 6 and 8 stages deep: 360 programs
# x stages x 4 KB in flight (5.9 MB at 4 stages, 11.8 MB at 8), still one wave at 8 (~70 KB shared
# a program, 3 an SM). At 20b's bucket-16 and -32 tiles 6 stages lost (v29, one program an SM).
for _s in (6, 8):
    V3_DEC_VARIANTS[f"v3-dd-w-s{_s}"] = Variant(
        "v3",
        tiles=_dec(Tiles(16, 32, 128, 4, _s), Tiles(16, 64, 128, 4, 4)),
        max_m=16,
        v3_dec_down=DecTiles(16, 32, 512, 4, 4, 3),
        wtma=True,
    )
# Both decode GEMMs split-K (moe_v3_dec_gu, 2026-11-28): the gate_up on the down's design with its
# own tiles (V3_GATE_UP_DEC: BK 128 over 2 warps, 12 programs an SM at T 1), 17.0 against 20.6 us at
# T 1 alone (its docstring). -dd2: the down on the same 2-warp tiles (11.0 against 14.1 us, one run).
_DD, _GU = DecTiles(16, 32, 512, 4, 4, 3), DecTiles(16, 32, 128, 2, 2, 4)
V3_DEC_VARIANTS["v3-dd-gu"] = Variant("v3", max_m=16, v3_dec_down=_DD, v3_dec_gate_up=_GU)
V3_DEC_VARIANTS["v3-dd2-gu"] = Variant("v3", max_m=16, v3_dec_down=_GU, v3_dec_gate_up=_GU)
# Both split-K decode GEMMs with their weights by TMA (GPTOSS_V3_DEC_WTMA covers the gate_up since
# 2026-11-29). At T 1 the gate_up (120b: 35 MB) runs ~20 us, ~1.7 TB/s, and keeps at most
# programs x stages x a stage's bytes in flight: 720 x 4 x 2 KB = 5.9 MB at the default tiles, about
# what 4.3 TB/s times a loaded DRAM latency of ~1.5 us needs, so latency may bound it. -s8, -k256
# and -k256s6 double or triple that and still fit the 720 programs in one wave (sm_90a with TMA:
# 72 / 89 / 89 registers at 2 warps, 17 / 15 / 24 KB shared: 13 / 11 / 9 programs an SM); -bn16
# twice the programs; -k256w4 4 warps a 256-K step (11 programs an SM by registers: 1.36 waves on
# cp.async, v25); -k512 the down's tiles.
_GU_W = {
    "v3-dd-gu-w": _GU,
    "v3-dd-gu-w-s8": DecTiles(16, 32, 128, 2, 2, 8),
    "v3-dd-gu-w-k256": DecTiles(16, 32, 256, 2, 2, 4),
    "v3-dd-gu-w-k256s6": DecTiles(16, 32, 256, 2, 2, 6),
    "v3-dd-gu-w-bn16": DecTiles(16, 16, 128, 2, 2, 4),
    "v3-dd-gu-w-k256w4": DecTiles(16, 32, 256, 4, 4, 4),
    "v3-dd-gu-w-k512": DecTiles(16, 32, 512, 4, 4, 3),
    # 2 warps of 256 K a step (4 chunks each): the step's fixed cost (barrier, TMA issue, x's load
    # and layout) over twice the weights. sm_90a, 120b's T 1 routing the logits, weights by TMA
    # (CPU-compiled, 2026-12-02): K loop 2.68 instructions a weight value against the table's 3.05,
    # 113 registers (9 programs an SM by registers, for 5.5 at T 1), 19 / 29 KB shared at 3 / 4
    # stages; BK 1024 2.54 but 168 registers. Why: at T 1 the gate_up reaches 48 % of what a pure
    # read of its 35 MB does (bench/results v46), issue-bound at ~11 warps an SM.
    "v3-dd-gu-w-k512w2": DecTiles(16, 32, 512, 2, 2, 3),
    "v3-dd-gu-w-k512w2s4": DecTiles(16, 32, 512, 2, 2, 4),
}
for _name, _t in _GU_W.items():
    V3_DEC_VARIANTS[_name] = Variant("v3", max_m=16, v3_dec_down=_DD, v3_dec_gate_up=_t, wtma=True)

# Both split-K kernels at 9-16 tokens on x tiles of 8 or 4 rows (BM; the defaults' 16 at T 16): an
# expert of a 16-token batch gets 2 rows on average (20b: 64 choices over 32 experts), so BM 16 mostly
# multiplies zeros: K loop 3.82 against 3.06 instructions a value at the down's BM 16 / 8 (sm_90a,
# moe_v3_dec's docstring), 4.16 against 3.42 at the gate_up's. Rows past BM loop over the same
# weights (L2-warm: a program's 32 rows x K are 49 KB). At T 16 the defaults lost to v2's slot
# kernels: 188.9 against 167.3 us at 20b, 310.1 against 279.5 at 120b (v47). -n64: 64 weight rows
# a program over 4 warps (half the programs: at T 16 20b's gate_up has ~25 experts x 180 row blocks).
for _bm in (8, 4):
    V3_DEC_VARIANTS[f"v3-dd-gu-w-bm{_bm}"] = Variant(
        "v3",
        max_m=16,
        v3_dec_down=DecTiles(_bm, 32, 512, 4, 4, 3),
        v3_dec_gate_up=DecTiles(_bm, 32, 128, 2, 2, 4),
        wtma=True,
    )
V3_DEC_VARIANTS["v3-dd-gu-w-bm8n64"] = Variant(
    "v3",
    max_m=16,
    v3_dec_down=DecTiles(8, 64, 512, 4, 4, 3),
    v3_dec_gate_up=DecTiles(8, 64, 256, 4, 4, 3),
    wtma=True,
)

# The 9-16 token tiles (v59's -bm8n64, the defaults then) against neighbours, with their sm_90a
# statistics at 20b (`bench/kernels/moe_v3_dec_sass.py --tiles ...`, weights by TMA; K loop
# instructions a weight value, registers, programs an SM): the defaults gate_up 3.05, 110, 4 and down
# 2.77, 163, 3, i.e. 12-16 of an SM's 64 warp slots. -cap: register caps for one more program an SM
# (gate_up r128: 95 registers, 5; down r128: 128, 4, 6 spills outside the loop; the big-batch defaults
# since v60); -n128: 128 weight rows a program (2.68 a value, 3 an SM); -gk512: the gate_up at BK 512
# (2.79, 147, 3); -bm4: x tiles of 4 rows at BK 512 (2.66 a value; 120b's experts get 0.5 rows on
# average at 16 tokens); -dk256s4: the down at BK 256, 4 stages (3.07, 123, 4; its 6 K steps a program
# become 12); -s4: both 4 deep. After the first sweep (-cap won at every size, 2-4 %): -cap-d96, the
# down at BK 256 under a cap of 96 (5 programs an SM, 34 spills outside the K loop); -cap-g80, the
# gate_up at 80 (6 an SM, 10 spills in the loop); -8-cap: the tiles up to 8 tokens at 96 (gate_up (8,
# 32, 256) 118 -> 96 registers, 8 -> 9 an SM; down (8, 32, 512) 123 -> 96, 4 -> 5, 4 spills outside
# the loop), their batches many waves long.
_N64_GU, _N64_DN = DecTiles(8, 64, 256, 4, 4, 3), DecTiles(8, 64, 512, 4, 4, 3)
_CAP_GU, _CAP_DN = DecTiles(8, 64, 256, 4, 4, 3, maxnreg=128), DecTiles(8, 64, 512, 4, 4, 3, maxnreg=128)
for _name, _gu, _dn in [
    ("v3-9-cap", _CAP_GU, _CAP_DN),
    ("v3-9-n128", DecTiles(8, 128, 256, 4, 4, 3), DecTiles(8, 128, 256, 4, 4, 3)),
    ("v3-9-gk512", DecTiles(8, 64, 512, 4, 4, 3), _N64_DN),
    ("v3-9-bm4", DecTiles(4, 64, 512, 4, 4, 3), DecTiles(4, 64, 512, 4, 4, 3)),
    ("v3-9-dk256s4", _N64_GU, DecTiles(8, 64, 256, 4, 4, 4)),
    ("v3-9-s4", DecTiles(8, 64, 256, 4, 4, 4), DecTiles(8, 64, 512, 4, 4, 4)),
    ("v3-9-cap-d96", _CAP_GU, DecTiles(8, 64, 256, 4, 4, 3, maxnreg=96)),
    ("v3-9-cap-g80", DecTiles(8, 64, 256, 4, 4, 3, maxnreg=80), _CAP_DN),
    ("v3-8-cap", DecTiles(16, 32, 256, 2, 2, 4, maxnreg=96), DecTiles(16, 32, 512, 4, 4, 3, maxnreg=96)),
]:
    V3_DEC_VARIANTS[_name] = Variant("v3", max_m=16, v3_dec_down=_dn, v3_dec_gate_up=_gu, wtma=True)

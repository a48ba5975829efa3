"""Block sizes of the MoE GEMMs, from the shapes (no autotuning): Tiles, the tables by rows per
expert, choose_tiles (v1), choose_tiles_v2 and choose_tiles_v3, and the grid they give; DecTiles and
dec_tiles for the decode path (moe_decode)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace

import triton


@dataclass(frozen=True, slots=True)
class Tiles:
    bm: int  # token rows per tile (the narrow dot operand)
    bn: int  # output columns per program (gate_up: act columns, i.e. weight-row pairs)
    bk: int  # K per step; a multiple of 32 (one scale per 32)
    warps: int
    stages: int
    split: int = 1  # v2 only: warps splitting each BK step along K (a batched MMA, summed at the end)
    xa: bool = False  # v2, split 1: x is the MMA's A operand, the dequantized weights B (through smem)
    half: bool = False  # v3: a tile with <= BM/2 rows runs a BM/2-wide body (one weight pass, less MMA)
    # v3: a register cap (ptxas .maxnreg) so that more programs fit an SM; None: the compiler's choice.
    # Bucket 32's BM-64 tiles at 3 stages hold 190 registers, 2 programs an SM; at 168 (sm_90a, weights by
    # TMA) 3 fit, with no spill in the K loop (bench/kernels/moe_variants.py "S-h128s3r").
    maxnreg: int | None = None


# By BM, the token rows an expert gets if routing is even (16..128). Each warp owns distinct weight
# rows (BN = 16 * warps for mma.sync, 64 rows a warpgroup for wgmma), so no weight is dequantized
# twice; checked in the sm_90a SASS, as are registers (<= 230, no spills) at the 20b shapes.
# Decode (BM 16) streams the weights: 90 N-tiles an expert, 2-warp programs, 256 K (128 B a row)
# a step, 4 stages in flight. Past BM 32 the GEMMs are compute-bound: wgmma tiles.
_GATE_UP_TILES = {
    16: Tiles(16, 32, 256, 2, 4),
    32: Tiles(32, 64, 128, 4, 3),
    64: Tiles(64, 64, 128, 4, 3),
    128: Tiles(64, 128, 64, 8, 3),
}
_DOWN_TILES = {
    16: Tiles(16, 32, 256, 2, 4),
    32: Tiles(32, 64, 128, 4, 3),
    64: Tiles(64, 128, 64, 8, 3),
    128: Tiles(128, 128, 64, 8, 3),
}


def choose_tiles(t: int, top_k: int, e: int, n: int, k: int, gate_up: bool) -> Tiles:
    """Block sizes from the shapes, no autotuning. n: output columns (gate_up: I), k: the K dim."""
    rows = triton.cdiv(t * top_k, e)  # rows an expert gets if routing is even
    cfg = (_GATE_UP_TILES if gate_up else _DOWN_TILES)[min(128, max(16, triton.next_power_of_2(rows)))]
    bn = min(cfg.bn, max(16, triton.next_power_of_2(n)))
    bk = min(cfg.bk, 1 << (k.bit_length() - 1))  # <= K; K % BK != 0 takes the masked path
    return Tiles(cfg.bm, bn, bk, min(cfg.warps, bn // 16), cfg.stages)


# v2 (weights in the bits layout), by BM as above. Decode and BM 32 split each 512-K step over 4
# warps, one 128-K slice a warp, every warp on all BN rows (no weight dequantized twice, 4x the
# resident warps of one warp per 16 rows: 1440 warps over the 4 experts' gate/up rows at T = 1).
# A slice is >= 128 K so its scales are whole int32 words (cp.async needs >= 4 bytes a thread).
# Past BM 32, wgmma tiles with BK 128. In the sm_90a SASS (20b shapes, bf16): 3.3 instructions a
# weight value at decode (v1: 4.9), of which 1.66 dequant, 0.25 HMMA and ~0.45 moves of the x
# operand between its LDS.128 and the HMMA register pairs; BM 128 gate_up 5.6 a value for 128 rows
# (v1 at T 4096: 6.0 for 64 rows). Registers <= 255, spills only outside the K loop.
# Buckets 32 and 64 (M 128-512 at 20b, Offline decode) take 32-row xa tiles: measured on the H100
# (bench/results 2026-11-22 v5) M 256 645 -> 438 us, M 512 753 -> 672 us; xa at BM 64/128 was slower.
_XA32 = Tiles(32, 64, 128, 4, 3, xa=True)
_GATE_UP_TILES_V2 = {
    16: Tiles(16, 32, 512, 4, 3, 4),
    32: _XA32,
    64: _XA32,
    128: Tiles(128, 128, 128, 8, 3),
}
_DOWN_TILES_V2 = {
    16: Tiles(16, 32, 512, 4, 3, 4),
    32: _XA32,
    64: _XA32,
    128: Tiles(128, 128, 128, 8, 3),
}
# 120b (128 experts): Offline decode batches give 32-64 rows an expert, and there the down GEMM on
# 128-column xa tiles measured faster on the H100 (bench/results 2026-11-23 v11, --experts 128): M 1024
# 612 -> 514 us, M 2048 972 -> 806 us (the gate_up was not faster on them: 1070 -> 1118).
# Untimed alone at 20b's 32 experts, which keep _XA32.
MANY_EXPERTS = 128
_DOWN_TILES_V2_MANY = {32: Tiles(32, 128, 128, 4, 3, xa=True), 64: Tiles(32, 128, 128, 4, 3, xa=True)}
TILE_OVERRIDE: dict[tuple[int, bool], Tiles] = {}  # (BM bucket, gate_up) -> v2 or v3 tiles; for benchmarks


# 120b at 9-16 rows an expert (M 257-512: a DP replica's Offline batch of ~500) takes bucket 32's
# tiles (BM 32): at BM 16 the ~42 % of the experts above the mean rows took a second tile that
# streamed their weights again. H100, 120b shapes, M 512, whole MoE (bench/results v21, "v2-up"):
# 1566.3 -> 1256.6 us (gate_up 1006.6 -> 785.6, down 511.4 -> 451.7). From 17 rows the next bucket's
# BM 64 was 2.3x slower (M 1024: 1605.0 -> 3696.5), so past 16 rows the buckets stay. (That run's
# down tile had 64 columns; bucket 32's for many experts has 128, v11's pick at 32-64 rows.)
def choose_tiles_v2(t: int, top_k: int, e: int, n: int, k: int, gate_up: bool) -> Tiles:
    """choose_tiles for the v2 kernels: BK/split >= 128 (whole scale words) and BK <= 512 (scale pad)."""
    rows = triton.cdiv(t * top_k, e)
    many = e >= MANY_EXPERTS
    bucket = 32 if many and 8 < rows <= 16 else min(128, max(16, triton.next_power_of_2(rows)))
    return tiles_v2(bucket, n, k, gate_up, many_experts=many)


def tiles_v2(bucket: int, n: int, k: int, gate_up: bool, many_experts: bool = False) -> Tiles:
    """The v2 tiles of a BM bucket (16, 32, 64 or 128) fitted to n and k; TILE_OVERRIDE applies."""
    table = _GATE_UP_TILES_V2 if gate_up else _DOWN_TILES_V2
    if many_experts and not gate_up:
        table = table | _DOWN_TILES_V2_MANY
    cfg = TILE_OVERRIDE.get((bucket, gate_up)) or table[bucket]
    bn = min(cfg.bn, max(16, triton.next_power_of_2(n)))
    split = cfg.split
    bk = max(128 * split, min(cfg.bk, triton.next_power_of_2(k)))  # past K: the masked tail
    warps = cfg.warps if split > 1 else min(cfg.warps, bn // 16)
    return Tiles(cfg.bm, bn, bk, warps, cfg.stages, split, cfg.xa)


# v3, by BM as above, plus a bucket 512 (rows an expert gets >= 512: M >= 4096 at 20b; rows
# 129-511 stay in bucket 128): wgmma tiles, one warpgroup per 64 weight rows (the MMA's M), the
# weights the register operand. In the sm_90a SASS of the "v3" layout (20b shapes, bf16), the K loop
# issues ~3.7-4.1 instructions a weight value a thread (v2 BM 128: 5.5), wgmma async (up to 15
# pending) under the next dequant, every load through cp.async, no convert through shared memory;
# down 128x256: BK 64 (241 registers; BK 128 spills 9), 64 divides 2880 so no masked K tail.
# Measured on the H100 (bench/kernels/moe_gpu.py, whole MoE in a CUDA graph, 2026-11-22 round 1):
# gate_up 128x128 BK 64, 4 stages (v3-k64) 598 -> 520 us at M 1024, 1736 -> 1413 at M 4096, 6478
# -> 5215 at M 16384; down 256x128 BK 64 (v3-bm256) 923 -> 672 us at M 4096, 3370 -> 2381 at M
# 16384. Buckets 16-64 were slower than v2 then (M 256: v3 667 us, v2 428); since the 16-byte
# weight loads (v19) they are faster, and on BM twice the bucket with a half body (below) more so.
# Buckets 128 and 512 take BM-256 tiles, tiles of <= 128 rows on the BM-128 body (Tiles.half):
# Offline's decode batches of ~1000 give 125 +- 11 rows an expert (random routing), so at BM 128
# about half the experts took a second, nearly empty tile that dequantized and streamed all their
# weights again; a 256-row tile passes them once. gate_up's rows interleaved by 8 (moe_v3) keep its
# gate and up halves in 128 accumulator registers at BM 256 (sm_90a: 255 registers, no spills; the
# SwiGLU's split stays in registers, no convert_layout). H100, whole MoE (2026-11-26, v14; before:
# gate_up 128x128 / down 128x256, bucket 512's down 256x128): M 1024 917 -> 816 us, 2048 1478 ->
# 1115, 4096 2451 -> 1899, 16384 8734 -> 6782.
# Bucket 128 takes them 4 stages deep (2026-11-27, v19, bench/moe_large_gpu.sh: gate_up / down alone,
# µs, 3 -> 4 stages: M 1024 520.8 -> 480.1 / 275.0 -> 252.6, M 2048 707.6 -> 710.3 / 378.3 -> 362.9;
# Offline 1000 x (1024 -> 1024) 17,647 -> 17,922-17,961 tok/s). Bucket 512 (M >= 4096: Offline's
# mixed steps, ~16.5k tokens) stays at 3: 5 stages timed faster GEMM by GEMM (M 16384 gate_up 4473.7
# -> 4195.3, down 2348.4 -> 2184.3) but slower as a whole MoE in the same process (6437.8 -> 6870.8;
# eager 6682.9 -> 7052.9), so not proven. The 256-weight-row tiles of matmul_ogs' shape (BK 128) ran
# 1.7-2.2x slower: at 255 registers their 16 wgmmas a step hold 64 registers of dequantized A, so
# the next step's dequant waits for them (sm_90a SASS: a DEPBAR after each pair); 4-warp tiles (2-4
# programs an SM) 10-45 % slower.
_WIDE_GU, _WIDE_DN = Tiles(256, 64, 64, 8, 3, half=True), Tiles(256, 128, 64, 8, 3, half=True)
_WIDE_GU4, _WIDE_DN4 = replace(_WIDE_GU, stages=4), replace(_WIDE_DN, stages=4)
# Buckets 16-64 (few rows an expert: 20b at M 17-512, 120b's Offline decode at M ~250-2000) take
# BM twice the bucket on a BM/2 body (half), one warpgroup over 128 weight rows, BK 128, 4 stages
# ("S-h128"): with random routing ~45 % of the experts get more than the mean rows, and at BM = the
# bucket they took a second tile that streamed their weights again. H100, whole MoE in a CUDA graph,
# µs (bench/results v21, `moe_gpu.py --experts 128|32`), v2 / v3 on the former tiles (BM = bucket) /
# these: 120b shapes M 256 1201 / 811 / 788, M 512 1566 / 1068 / 895, M 1024 1605 / 1322 / 1139-1178,
# M 2048 2559 / 2138 / 2016; 20b M 32 260 / 208 / 214, M 64 277 / 220 / 218, M 128 367 / 277 / 251,
# M 256 433 / 333 / 299, M 512 669 / 559 / 527. At bucket 64 "S-h256k64" (BM 128, BK 64, 256 weight
# rows, 6 stages) timed faster still (120b M 2048 1575, 20b M 512 424); its bucket-32 tiles (BM 64,
# BK 64, half) gave other bits (err 3.2e-3 against 1e-4 for the rest, as the odd BK-64 half tile of
# test_v3_prefill_tiles_on_gpu), so bucket 64 alone takes them (below).
# Since 2026-12-02 they run 3 stages deep under a register cap ("S-h128s3r"), bucket 16 at 128
# registers (4 programs an SM), bucket 32 at 168 (3; uncapped 190-192 registers and 92 KB of shared
# memory at 4 stages fit 2, and Nsight Compute had their warps waiting on fixed-latency dependencies
# with 2 a scheduler, bench/results v45). sm_90a, TMA or cp.async weights: no spill in the K loop,
# 3.2-3.4 instructions a weight value as uncapped. H200, 120b shapes, whole MoE in a CUDA graph,
# weights by TMA, median of 3 interleaved rounds (bench/results v46), µs, 4 stages uncapped -> these:
# M 512 727.1 -> 699.0, M 664 (Offline's mean decode batch) 861.8 -> 782.9, M 1024 1045.5 -> 973.0
# (BK 64 at 4 stages: 956.6; at 6: 999.0); the same bits (test_v3_few_rows_tiles_on_gpu).
_FEW_GU = {b: Tiles(2 * b, 64, 128, 4, 3, half=True, maxnreg=r) for b, r in ((16, 128), (32, 168))}
_FEW_DN = {b: Tiles(2 * b, 128, 128, 4, 3, half=True, maxnreg=r) for b, r in ((16, 128), (32, 168))}
# Bucket 64 takes S-h256k64's tiles (BM 128 on a half body, 128 / 256 weight rows, BK 64, 6 stages)
# since 2026-12-02: H200, whole MoE in a CUDA graph, weights by TMA as the engine loads them, median of
# 3 interleaved rounds (bench/results v44, `moe_gpu.py --no-vllm --variants engine,S-b64k64`), µs:
# 20b M 512 517.0 -> 398.8, 120b M 2048 1976.2 -> 1491.2 (the same bits). Their down races on the
# cp.async path (moe_v3.racy_pointer_down): where the weights come that way (GPTOSS_MOE_V3_WTMA=0,
# or a device without TMA) the bucket's down keeps its former tiles (_POINTER_DOWN_V3).
_K64_GU, _K64_DN = Tiles(128, 128, 64, 8, 6, half=True), Tiles(128, 256, 64, 8, 6, half=True)
_POINTER_DOWN_V3 = {64: Tiles(128, 128, 128, 4, 4, half=True)}  # S-h128's, bucket 64's until then
# Decode batches (T <= DECODE_MAX_T tokens: no expert gets more than 16 rows), key DECODE_BUCKET:
# one BM-16 tile an expert (no half body: BM 16 is the narrowest tl.dot), one warpgroup over 64
# weight rows (gate_up: 32 act columns; a down tile of 32 rows gives other bits), BK 128, 4 stages.
# Until v23 these batches took bucket 16's tiles (128 weight rows, BM 32 on a half body: at T 1,
# 180 gate_up and 92 down programs for 132 SMs). H100, 120b shapes, whole MoE in a CUDA graph, us
# at M 1 / 4 / 16 (bench/results v23, one process a variant): bucket 16's 63.9 / 130.8 / 253.9,
# these 59.7 / 127.7 / 230.5; 6 stages 62.2 / 137.3 / 254.2; BK 64, 8 stages 58.8 / 128.2 / 232.8;
# BK 256 64.3 / 149.2 / 286.6; the v2 decode kernels 55.9 / 122.3 / 247.6; vLLM 72.4 / 148.5 / 252.0.
DECODE_BUCKET, DECODE_MAX_T = 0, 16
_DEC_GU_V3, _DEC_DN_V3 = Tiles(16, 32, 128, 4, 4), Tiles(16, 64, 128, 4, 4)
_GATE_UP_TILES_V3 = {DECODE_BUCKET: _DEC_GU_V3, **_FEW_GU, 64: _K64_GU, 128: _WIDE_GU4, 512: _WIDE_GU}
_DOWN_TILES_V3 = {DECODE_BUCKET: _DEC_DN_V3, **_FEW_DN, 64: _K64_DN, 128: _WIDE_DN4, 512: _WIDE_DN}
# The tiles of buckets 128 and 512 before (2026-11-22 to 26), for benchmarks (moe_variants "v3-128").
NARROW_V3 = {
    (128, True): Tiles(128, 128, 64, 8, 4),
    (128, False): Tiles(128, 256, 64, 8, 4),
    (512, True): Tiles(128, 128, 64, 8, 4),
    (512, False): Tiles(256, 128, 64, 8, 3),
}


def _v3_env_tiles(v: str | None) -> dict[tuple[int, bool], Tiles]:
    """GPTOSS_MOE_V3_TILES="gate_up=BM,BN,BK,W,S[,half][,rNREG];down@512=..." -> (bucket, gate_up) ->
    tiles. "@dec" names DECODE_BUCKET (T <= DECODE_MAX_T); rNREG caps the registers (Tiles.maxnreg). A
    GEMM without @bucket sets buckets 128 and 512 (the large-batch tiles); for A/B runs of the engine
    against the tables above without editing them."""
    out: dict[tuple[int, bool], Tiles] = {}
    names = {str(b): b for b in _GATE_UP_TILES_V3 if b != DECODE_BUCKET} | {"dec": DECODE_BUCKET}
    for item in filter(None, (v or "").split(";")):
        key, _, spec = item.partition("=")
        gemm, _, bucket = key.strip().partition("@")
        t = parse_tiles_spec(spec)
        if gemm not in ("gate_up", "down") or bucket not in ("", *names) or t is None:
            raise ValueError(
                f"GPTOSS_MOE_V3_TILES: {item!r} is not gate_up|down[@BUCKET]=BM,BN,BK,WARPS,STAGES[,half]"
                f"[,rNREG] (buckets {', '.join(names)})"
            )
        if t.bk % 64 or t.bn % 16 or t.bm & (t.bm - 1) or t.bm < 16 or t.warps not in (4, 8) or t.stages < 1:
            raise ValueError(
                f"GPTOSS_MOE_V3_TILES: {item!r}: BK a multiple of 64, BN of 16, BM a power of 2 >= 16, "
                "4 or 8 warps, >= 1 stage"
            )
        for b in [names[bucket]] if bucket else [128, 512]:
            out[(b, gemm == "gate_up")] = t
    return out


def parse_tiles_spec(spec: str) -> Tiles | None:
    """A GEMM's tiles as tiles_spec writes them, BM,BN,BK,WARPS,STAGES[,half][,rNREG] (a register cap N
    from 64 to 255) -> Tiles; None if spec is not that."""
    parts = spec.split(",")
    if len(parts) not in (5, 6, 7) or not all(p.isdigit() for p in parts[:5]):
        return None
    extras = parts[5:]
    half = extras[:1] == ["half"]
    rest = extras[1:] if half else extras
    nreg = None
    if rest:
        if not (len(rest) == 1 and re.fullmatch(r"r\d+", rest[0]) and 64 <= int(rest[0][1:]) <= 255):
            return None
        nreg = int(rest[0][1:])
    bm, bn, bk, warps, stages = map(int, parts[:5])
    return Tiles(bm, bn, bk, warps, stages, half=half, maxnreg=nreg)


def tiles_spec(t: Tiles) -> str:
    """t as GPTOSS_MOE_V3_TILES spells a GEMM's tiles: BM,BN,BK,WARPS,STAGES[,half][,rNREG]."""
    spec = f"{t.bm},{t.bn},{t.bk},{t.warps},{t.stages}" + (",half" if t.half else "")
    return spec + (f",r{t.maxnreg}" if t.maxnreg else "")


V3_ENV_TILES = _v3_env_tiles(os.environ.get("GPTOSS_MOE_V3_TILES"))


def bucket_v3(rows: int, t: int | None = None) -> int:
    """The v3 tables' key for the rows an expert gets: DECODE_BUCKET for t <= DECODE_MAX_T tokens,
    else 16..128 as v1/v2, 512 from 512 rows on."""
    if t is not None and t <= DECODE_MAX_T:
        return DECODE_BUCKET
    return 512 if rows >= 512 else min(128, max(16, triton.next_power_of_2(rows)))


def choose_tiles_v3(
    t: int, top_k: int, e: int, n: int, k: int, gate_up: bool, cp_async: bool = False
) -> Tiles:
    """choose_tiles for the v3 kernels (TILE_OVERRIDE, then GPTOSS_MOE_V3_TILES apply): BN >= 64 (a
    warpgroup's wgmma rows), BK a multiple of 64 (the "v3" layout's K chunk; past K the masked tail).
    cp_async: the down's weights come by cp.async (moe_v3.pointer_down): the table's tiles that race
    there give way to _POINTER_DOWN_V3's (an override is taken as given: down_v3 refuses it)."""
    bucket = bucket_v3(triton.cdiv(t * top_k, e), t)
    key = (bucket, gate_up)
    table = (_GATE_UP_TILES_V3 if gate_up else _DOWN_TILES_V3)[bucket]
    if cp_async and not gate_up:
        table = _POINTER_DOWN_V3.get(bucket, table)
    cfg = TILE_OVERRIDE.get(key) or V3_ENV_TILES.get(key) or table
    bn = min(cfg.bn, max(64, triton.next_power_of_2(n)))
    bk = min(cfg.bk, max(64, triton.next_power_of_2(k)))  # a multiple of 32; past K the masked tail
    rows = 2 * bn if gate_up else bn  # gate_up's dot covers a gate and an up row per act column
    return Tiles(
        cfg.bm, bn, bk, min(cfg.warps, max(4, rows // 16)), cfg.stages, half=cfg.half, maxnreg=cfg.maxnreg
    )


def _grid(t: int, top_k: int, e: int, n: int, tiles: Tiles) -> tuple[int, int]:
    a = t * top_k
    # Each expert's rows fill whole tiles but its last: at most (A + min(E, A)*(BM-1)) / BM tiles.
    max_tiles = min(a, (a + min(e, a) * (tiles.bm - 1)) // tiles.bm)
    return triton.cdiv(n, tiles.bn), max_tiles


# The decode path (moe_decode, T <= 16): expert-slot GEMMs, one tile of rows an expert.
@dataclass(frozen=True, slots=True)
class DecTiles:
    bm: int  # rows per dot (the narrow N of the MMA); an expert's rows past BM loop
    bn: int  # output columns per program (gate_up: act columns, each a gate and an up weight row)
    bk: int  # K per step, split over `split` warps (BK/split >= 128: whole scale words)
    split: int
    warps: int  # = split when split > 1 (fewer warps would dequantize some weights twice)
    stages: int
    maxnreg: int | None = None  # a register cap (ptxas .maxnreg): more programs resident an SM
    per_sm: int = 0  # > 0: the flat kernels (moe_decode_flat), a fixed grid of per_sm programs an SM


# In the sm_90a SASS at 20b (bf16, compiled on CPU by bench/kernels/moe_decode_sass.py; no spills,
# 16-byte cp.async weight loads), K loop: gate_up BN 16 at BM 8 (T >= 5): 3.1 instructions a
# weight value, 157 registers, 50 KB shared (3 programs an SM); at BM 1-4 (T <= 4): 3.0, ~122
# registers, 29-38 KB (4 an SM); BN 32: 2.8 a value but 218 registers (2 an SM), and 360 programs at
# T = 1 are 1.4 waves of 264. BM 16 (v2's): 4.0 a value. down (grid H / BN x slots): BN 32 with 4
# warps of 128 K and 3 stages beat BN 16 with 8 warps, BK 1024 and 4 stages (H100, whole MoE at T = 1:
# 52.8 against 55.2 us; down alone 17.1-64.8 us at T = 1-16); SASS at BM 8: 3.0 instructions a value,
# 158 registers, 33 KB shared (BN 16, BK 1024: 3.6 a value).
GATE_UP_DEC_TILES = DecTiles(8, 16, 512, 4, 4, 4)
DOWN_DEC_TILES = DecTiles(8, 32, 512, 4, 4, 3)
# The flat kernels (moe_decode_flat) at BM 8 (T >= 5), 4 programs an SM; the slot kernels below.
# H100, 20b, whole decode MoE in a CUDA graph (bench/results v17), slot / flat P=4, us: M 1 53.0 /
# 55.0, M 4 97.6 / 101.5, M 8 128.0 / 125.9, M 16 170.5 / 163.2; P 1-3 slower at every M.
# GPTOSS_MOE_FLAT=P forces P programs an SM at every T (0: the slot kernels always).
FLAT_PER_SM, FLAT_MIN_BM = 4, 8


def _flat_forced(v: str | None) -> int | None:
    if v in (None, ""):
        return None
    if not v.isdigit():
        raise ValueError(f"GPTOSS_MOE_FLAT must be a count of programs an SM (0: never flat), got {v!r}")
    return int(v)


FLAT_FORCED = _flat_forced(os.environ.get("GPTOSS_MOE_FLAT"))
# GPTOSS_GATE_UP_MAXNREG=80 caps gate_up's registers at BM <= 4 (T <= 4): 6 programs an SM instead
# of 4 (122 registers), so T = 1's 720 programs (180 column blocks x 4 experts) run as one wave of
# 792 slots instead of 1.36 waves of 528. In the sm_90a SASS the cap spills 50 instructions, none in
# the K loop (bench/kernels/moe_decode_sass.py). Off: slower on the H100 (2026-11-26, batch 1: 363.9
# tok/s against 383-391; all switches' profile: gate_up 24.9 us a layer with the cap and routing, 20.4
# without either): one wave of 6 programs an SM, each on fewer registers, streams slower.
GATE_UP_MAXNREG = int(os.environ.get("GPTOSS_GATE_UP_MAXNREG", "0")) or None
DEC_TILE_OVERRIDE: dict[bool, DecTiles] = {}  # gate_up? -> tiles; for benchmarks


def dec_tiles(gate_up: bool, k: int, t: int = 1 << 30) -> DecTiles:
    """The decode tiles for a GEMM with K = k at T = t: BM shrinks to T's power of 2 (an expert has <= T
    rows; the x tile in shared memory shrinks with it), BK toward K (no empty steps) and to where the
    last step's scale words stay inside the row (rows hold ceil(K/512)*512 K of scales); warps = split."""
    override = DEC_TILE_OVERRIDE.get(gate_up)
    cfg = override or (GATE_UP_DEC_TILES if gate_up else DOWN_DEC_TILES)
    split = cfg.split
    bk = max(128 * split, min(cfg.bk, triton.next_power_of_2(k)))
    while triton.cdiv(k, bk) * bk > triton.cdiv(k, 512) * 512:  # ends at BK <= 512
        bk //= 2
        split = max(1, min(split, bk // 128))
    bm = min(cfg.bm, triton.next_power_of_2(t))
    maxnreg = cfg.maxnreg
    if maxnreg is None and gate_up and bm <= 4:
        maxnreg = GATE_UP_MAXNREG
    if override is not None:
        per_sm = cfg.per_sm
    elif FLAT_FORCED is not None:
        per_sm = FLAT_FORCED
    else:
        per_sm = FLAT_PER_SM if bm >= FLAT_MIN_BM else 0
    warps = split if split > 1 else cfg.warps
    return DecTiles(bm, cfg.bn, bk, split, warps, cfg.stages, maxnreg, per_sm)

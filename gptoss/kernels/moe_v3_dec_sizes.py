"""Which decode batches the split-K MoE GEMMs (moe_v3_dec's down, moe_v3_dec_gu's gate_up) take, and on
which tiles: the batch sizes (SPLIT_K_TOKENS, or a variable's list), the tile variables, the switch to
the big-batch tiles (BIG_FROM, BIG_ALSO), a tile set fitted to a batch and K, and whether its weights may come
by TMA. The kernels and their launches are in those two modules; each keeps its own variables'
defaults (TOKENS, V3_DOWN_DEC / V3_GATE_UP_DEC and their _BIG tiles).
"""

from __future__ import annotations

import os
import re

import triton

from gptoss.kernels.moe_tiles import DECODE_MAX_T, DecTiles

# The decode batch sizes whose MoE takes the split-K kernels (moe_v3_dec's down, moe_v3_dec_gu's gate_up; on
# 20b's two copies, kernel_model.DECODE_ON_LARGE: the v3 copy's). H200, one engine process a model,
# CUDA graphs, the variants interleaved, 128 -> 512 tokens, tok/s (bench/results v47): 20b batch 2
# 834.1 -> 938.3, 3 976.5 -> 952.5, 4 1,303.7 -> 1,272.8, 5 1,345.7 -> 1,432.4, 6 1,521.0 ->
# 1,623.4, 7 1,700.0 -> 1,808.4, 8 1,939.5 -> 2,063.8 (v2's decode kernels -> these); 120b batch 2
# 579.3 -> 621.0, 4 806.1 -> 788.2, 6 850.2 -> 868.0, 8 1,051.1 -> 1,071.0 (v3's decode tiles ->
# these). Batches of 3 and 5-7 then replayed the graphs of 4 and 8, so the graphs decided at T 2, 4
# (BM 4: loses on both models) and 8; 5-7 follow their BM 8. Since v48 every size up to 8 has its
# graph (decode_graphs.GRAPH_SIZES), and the committed sizes against batch 1 only gave 20b batch 2
# 829.8 -> 936.9, 5 1,464.4 -> 1,566.7, 7 1,778.4 -> 1,902.1, 8 1,940.0 -> 2,057.4. At 3, 12 and 16
# they lose in the engine (20b, v53: 1,079.2 against 1,093.1, 1,827.2 / 2,233.1, 2,252.1 / 2,773.0),
# and from 9 tokens alone in a graph too (moe_gpu.py, M 16: 188.9 against 167.3 us at 20b, 310.1
# against 279.5 at 120b). Batch 1 since v24 / v36. Batches of 9-16 since v59, on tiles of their own
# (moe_v3_dec.V3_DOWN_DEC_BIG, from 8 tokens since v60): those losses were BM 16's. Batches of 3 and 4
# since v62, on the big-batch tiles (BIG_ALSO; v47's losses were BM 4 on the small ones): H200, 128 ->
# 512 tokens, tok/s, best of 2 interleaved rounds, old (20b: v2's decode kernels on the bits copy;
# 120b: v3's decode tiles) -> these: 20b batch 3 1,107.8 -> 1,146.0, 4 1,296.7 -> 1,333.9; 120b batch 3
# 690.6 -> 733.0, 4 803.3 -> 835.4; on the small tiles (BM 4) 20b batch 3 lost (1,086.9).
SPLIT_K_TOKENS = frozenset(range(1, 17))


def env_tokens(
    v: str | None, name: str, gemm: str, default: frozenset[int] = SPLIT_K_TOKENS
) -> frozenset[int]:
    """The decode batch sizes that take a split-K kernel (variable `name`, value v): unset `default`;
    N: 1..N (0: none); or a comma list of sizes and ranges (1,2,5-8), each in 1..DECODE_MAX_T."""
    if v in (None, ""):
        return default
    bad = ValueError(
        f"{name} must say which decode batch sizes take the split-K {gemm}: N for 1..N (0: none, up "
        f"to {DECODE_MAX_T}) or sizes and ranges such as 1,2,5-8 within 1..{DECODE_MAX_T}, got {v!r}"
    )
    if v.isdigit():
        if int(v) > DECODE_MAX_T:
            raise bad
        return frozenset(range(1, int(v) + 1))
    sizes: set[int] = set()
    for item in v.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", item)
        if m is None or not 1 <= int(m[1]) <= int(m[2] or m[1]) <= DECODE_MAX_T:
            raise bad
        sizes.update(range(int(m[1]), int(m[2] or m[1]) + 1))
    return frozenset(sizes)


def _tiles_fit(t: DecTiles) -> bool:
    """Whether a split-K decode kernel can take t: whole 16-row blocks and 64-K chunks a warp."""
    return not (t.bn % 16 or t.bk % (64 * t.split) or t.bm & (t.bm - 1) or t.split & (t.split - 1))


def split_copies_fit(t: DecTiles) -> bool:
    """Whether a split-K decode kernel can take tiles t's weights by TMA (WTMA) on the GPU: each warp's
    share of a step (BN/16 row blocks x BK/SPLIT/64 chunks) at least 2 chunks. An H200 faulted
    ("misaligned address") at BN 16, BK 128 over 2 warps (1 chunk a warp) and ran BN 16 at BK 256 over
    2, BN 32 at BK 128 over 2 and BN 32 at BK 64 on one (bench/results v58); such tiles take cp.async
    (the same bits). The interpreter copies any block."""
    return triton.knobs.runtime.interpret or t.bn // 16 * (t.bk // t.split // 64) >= 2


def parse_dec_tiles(v: str, name: str) -> DecTiles:
    """Tiles from "BM,BN,BK,SPLIT,WARPS,STAGES[,rNREG]" (rNREG a register cap), the value of `name` (a
    variable, or a bench tool's option), checked as a split-K decode kernel takes them."""
    parts = v.split(",")
    cap = parts.pop() if len(parts) == 7 and parts[-1].startswith("r") else None
    counts = parts + ([cap[1:]] if cap else [])
    if len(parts) != 6 or not all(p.isdigit() and int(p) > 0 for p in counts):
        raise ValueError(
            f"{name} must be BM,BN,BK,SPLIT,WARPS,STAGES (six positive counts), then optionally rNREG "
            f"(a register cap, e.g. r128), got {v!r}"
        )
    t = DecTiles(*map(int, parts), maxnreg=int(cap[1:]) if cap else None)
    if not _tiles_fit(t):
        raise ValueError(
            f"{name}: BN a multiple of 16, BK of 64 * SPLIT, BM and SPLIT powers of 2, got {v!r}"
        )
    return t


def env_dec_tiles(name: str, default: DecTiles) -> DecTiles:
    """A split-K decode kernel's tiles from the variable `name` (parse_dec_tiles; unset or empty:
    default), for engine A/B runs of tiles the kernel benches found (bench/gptoss_120b_ab_gpu.sh)."""
    v = os.environ.get(name, "")
    return parse_dec_tiles(v, name) if v else default


# From BIG_FROM tokens the split-K GEMMs take their big-batch tiles (moe_v3_dec.V3_DOWN_DEC_BIG's
# comment has the figures): from 9 since v59, from 8 since v60 (120b batch 8 +3.1 %, 20b -0.3 %).
BIG_FROM = 8
# And at BIG_ALSO's batches (v62, SPLIT_K_TOKENS' comment): an x tile of 4 rows there. Not at 2 or 5-7:
# 20b on the big tiles, batch 2 922.1 -> 867.2 tok/s, 5 1,558.6 -> 1,528.1, 6 1,734.0 -> 1,708.6, 7
# 1,895.5 -> 1,880.7 (H200, as there).
BIG_ALSO = frozenset({3, 4})
# With MANY_EXPERTS or more (120b's 128), 5-7 tokens take the big tiles too (v63, 120b on the big
# tiles, batch 5 901.7 -> 912.3 tok/s, 6 966.8 -> 989.5, 7 1,011.9 -> 1,037.4; v62: 5 911.1 -> 915.2,
# 7 1,022.7 -> 1,048.8): their 20-28 routed rows land on as many experts, one row each, where 20b's 32
# experts share some (and lose, above).
MANY_EXPERTS = 128
BIG_MANY = frozenset({5, 6, 7})


def batch_tiles(tokens: int, small: DecTiles, big: DecTiles, experts: int = 0) -> DecTiles:
    """A split-K kernel's default tiles for a batch of `tokens` over `experts` experts: big from
    BIG_FROM tokens on, at BIG_ALSO's, and at BIG_MANY's with MANY_EXPERTS or more."""
    many = experts >= MANY_EXPERTS and tokens in BIG_MANY
    return big if tokens >= BIG_FROM or tokens in BIG_ALSO or many else small


def fit_dec_tiles(tokens: int, k: int, t: DecTiles) -> DecTiles:
    """t fitted to T = tokens and K = k: BM T's power of 2 up to t.bm, BK down toward K padded to 64
    (no empty chunks past a short K), SPLIT to BK's chunks; warps = SPLIT; t's register cap kept."""
    if not _tiles_fit(t):
        raise ValueError(
            f"split-K decode MoE: {t} needs BN a multiple of 16, BK of 64 * SPLIT, BM and SPLIT powers of 2"
        )
    bk = max(64, min(t.bk, triton.next_power_of_2(triton.cdiv(k, 64) * 64)))
    split = min(t.split, bk // 64)
    bm = min(t.bm, triton.next_power_of_2(max(1, tokens)))
    return DecTiles(bm, t.bn, bk, split, split if split > 1 else t.warps, t.stages, t.maxnreg)

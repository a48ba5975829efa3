"""Paged attention's launch settings: each with the measurements that chose it, and the environment
variable that overrides it for an A/B run (a bad value is refused by name). gptoss.kernels.attention
reads them at every launch from its own namespace, so a benchmark may set attention.X as well."""

from __future__ import annotations

import os

# Decode splits the keys of a (sequence, KV head) over several programs until about this many
# programs per SM run; a split keeps at least MIN_SPLIT_KEYS keys so its partials (16 rows of
# m, l and D floats, written then read back) stay small next to the K/V it reads (256 B a key).
# Only small batches reach the bound (S x Hkv < PROGRAMS_PER_SM x SMs): at batch 1 a program then
# walks its keys in BLOCK_N steps one after another, so fewer keys a split shorten that chain;
# GPTOSS_ATTN_SPLIT_KEYS=N sets the bound (benchmarks: bench/gptoss_120b_ab_gpu.sh's B1_MODES). At
# 128 (H100, 20b, batch-1 128 -> 512, 2026-11-28): 404.4 against 406.6 tok/s, no gain; 256 stays.
# Launches of up to SMALL_DECODE sequences take SMALL_SPLIT_KEYS (GPTOSS_ATTN_SMALL_SPLIT_KEYS)
# instead, the width of their tile (SMALL_DECODE_CFG below): one tile a split, whose keys the preload
# (PRELOAD_KV) loads before the PDL wait. v37 took 32 on DECODE_CFG's 32-key tile (a sliding layer's
# window in 4 splits of one tile: +0.5 % against 256-key splits walking 32-key tiles); v38 one
# 256-key tile on 8 warps at 256 (+1.4 % against v37's); v44 one 128-key tile on 4 warps at 128.
PROGRAMS_PER_SM = 4
MAX_SPLITS = 64


def _split_keys_from_env(v: str | None, name: str = "GPTOSS_ATTN_SPLIT_KEYS", default: int = 256) -> int:
    if v in (None, ""):
        return default
    if not v.isdigit() or int(v) < 16:
        raise ValueError(f"{name} must be the fewest keys a decode split takes (>= 16), got {v!r}")
    return int(v)


MIN_SPLIT_KEYS = _split_keys_from_env(os.environ.get("GPTOSS_ATTN_SPLIT_KEYS"))
SMALL_SPLIT_KEYS = _split_keys_from_env(
    os.environ.get("GPTOSS_ATTN_SMALL_SPLIT_KEYS"), "GPTOSS_ATTN_SMALL_SPLIT_KEYS", 128
)


def _parse_cfg(name: str, v: str, shown: str | None = None) -> tuple[int, int, int]:
    """v = "BLOCK_N,num_warps,num_stages" checked; errors name `name` and show `shown` (default v)."""
    shown = v if shown is None else shown
    parts = v.split(",")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(
            f"{name} must be BLOCK_N,num_warps,num_stages (three positive counts), got {shown!r}"
        )
    block_n, warps, stages = map(int, parts)
    if block_n & (block_n - 1) or block_n < 16 or warps & (warps - 1):
        raise ValueError(
            f"{name}: BLOCK_N must be a power of two >= 16 and num_warps a power of two, got {shown!r}"
        )
    return block_n, warps, stages


def _cfg_from_env(name: str, default: tuple[int, int, int]) -> tuple[int, int, int]:
    """A (BLOCK_N, num_warps, num_stages) override such as GPTOSS_ATTN_DECODE=128,4,2 (benchmarks)."""
    v = os.environ.get(name, "")
    return _parse_cfg(name, v) if v else default


def _prefill_cfg_from_env(name: str, default: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    """A prefill launch's (BLOCK_N, num_warps, num_stages, rows), e.g. GPTOSS_ATTN_PREFILL=32,8,3,128:
    rows is its BLOCK_M, query tokens x the padded GQA group (a power of two >= 16)."""
    v = os.environ.get(name, "")
    if not v:
        return default
    parts = v.split(",")
    rows = int(parts[-1]) if parts[-1].isdigit() else 0
    if len(parts) != 4 or rows < 16 or rows & (rows - 1):
        raise ValueError(
            f"{name} must be BLOCK_N,num_warps,num_stages,rows (four counts, rows a power of two >= 16), "
            f"got {v!r}"
        )
    return (*_parse_cfg(name, ",".join(parts[:3]), v), rows)


def _choice_from_env(name: str, choices: tuple[str, ...]) -> str:
    """os.environ[name], one of `choices` (the first when unset): a typo is an error, never the default."""
    v = os.environ.get(name, "") or choices[0]
    if v not in choices:
        raise ValueError(f"{name}={v!r}: expected one of {', '.join(choices)}")
    return v


# (BLOCK_N, num_warps, num_stages) per path. Decode: swept on an H100 (bench/kernels/attn_sweep.py,
# 2026-11-27, bench/results v18): (32, 2, 3) against the first guess (64, 4, 3), us: 1000 sequences at
# 1536 context, sliding 145.6 vs 188.1, full 1161.9 vs 1176.8 (93 % of HBM); 256 at 4096, full 763.8 vs
# 843.6. Offline 1000 x (1024 -> 1024) +1.4 % (18,040.5 vs 17,797.2 tok/s, both warm), concurrency 16
# with LoRA +1.0 %, batch 1 within its noise (407-412 vs 405-410). Swept again on an H200 (2026-12-02,
# bench/results v43), us: 1024 x 1536 full (64, 2, 3) 803.8 against 857.8, sliding 119.0 against 124.0;
# 256 x 4096 full 537.3 against 558.9; as CUDA-graph replays beside FA3 (kernels_gpu.py) 256 x 8192 full
# 1,044.0 against 1,111.2 (FA3 1,116.9); Offline 20b 1000 x (1024 -> 1024), one machine, warm:
# 22,754 / 22,657 tok/s against 22,304 (+1.8 %). So (64, 2, 3) now.
DECODE_CFG = _cfg_from_env("GPTOSS_ATTN_DECODE", (64, 2, 3))
# Decode launches of up to SMALL_DECODE sequences (outside the batch-invariant mode) take their own
# (BLOCK_N, num_warps, num_stages): GPTOSS_ATTN_SMALL_DECODE, default (128, 4, 1) with 128-key splits
# (SMALL_SPLIT_KEYS) since 2026-12-02 (below), so a split is one tile that the preload (PRELOAD_KV)
# loads before the PDL wait. Until then (256, 8, 1) at 256 keys:
# at batch 1 a sliding layer's 128-key window is one split (no partials, no merge) and a 640-key
# context 3 live splits of a full layer's 16. None: DECODE_CFG's. H200, random 120b, batch-1 128 ->
# 512, one process, interleaved rounds (bench/results v38, two calls), tok/s: (256, 8, 1) 435.4 /
# 435.9 and 437.2 / 435.0 against DECODE_CFG's 32-key tile at 32-key splits 428.1 / 425.3 and 431.4 /
# 428.7 (attention 291-293 against 329-332 us a token); (64, 4, 2) at 64 keys 429.2 / 432.3; (128,
# 4, 2) 415.7 / 423.0; (128, 8, 2) 413.0 / 419.7; (256, 4, 1) 402.8 / 397.4; (256, 16, 1) 425.5 /
# 429.5; (512, 8, 1) 392.4 / 389.3. Releasing the O projection at each program's end rather than
# after the wait (so its weight preload would not run beside attention's loads) lost: 425.0 / 424.9,
# attention -12 and the projections +69 us a token.
# (128, 4, 1) at 128 keys was not among v38's: H200, CUDA-graph replays (bench/kernels/attn_sweep.py
# --small, bench/results v44), us, (256, 8, 1)@256 against (128, 4, 1)@128: batch 1 at 640 context
# under an 8192-key bound, full 5.1 / 4.6, sliding 3.9 / 2.9; 1k full 6.5 / 4.7; 8k full 13.9 / 9.6
# (FA3 13.3); batch 8 at 4k 43.8 / 25.8; (64, 4, 1)@64 and (128, 8, 1)@128 in between. In the engine
# (random 20b, 128 -> 512, decode_ab_gpu.py, one process, 2 rounds): batch 1 648.0 / 651.7 tok/s
# against 648.4 / 645.1, attention 153.2 -> 141.8 us a token; batch 8 1,933.4 / 1,929.6 against
# 1,934.7 / 1,938.4 (the same within the spread). 120b (the same attention shapes) is untimed with it.
SMALL_DECODE_CFG: tuple[int, int, int] | None = _cfg_from_env("GPTOSS_ATTN_SMALL_DECODE", (128, 4, 1))

# Prefill (BLOCK_N, num_warps, num_stages, rows), full layers and sliding ones apart
# (GPTOSS_ATTN_PREFILL, GPTOSS_ATTN_PREFILL_SLIDING): their registers differ. sm_90a, compiled on CPU,
# bf16: (64, 8, 3, 128) holds 127 registers a thread on a full layer (two programs an SM) and 173 on a
# sliding one (one program of 8 warps an SM); (16, 4, 3, 64) on a sliding one: 8 query tokens x 8 heads,
# a 135-key window span in 9 tiles of 16 (3 of 64 before). H200, one prefill of T tokens
# (bench/kernels/attn_sweep.py --prefill, bench/results v43), us at T 4k / 16k: sliding (16, 4, 3, 64)
# 70.4-78.8 / 252.9-253.7 against 137.9-138.1 / 522.8 at (64, 8, 3, 128); as CUDA-graph replays beside
# FA3 1.13-1.17x FA3 (the old setting ~0.55x at 4k-16k); full layers: (64, 8, 3, 128) fastest of 16.
PREFILL_CFG = _prefill_cfg_from_env("GPTOSS_ATTN_PREFILL", (64, 8, 3, 128))
PREFILL_SLIDING_CFG = _prefill_cfg_from_env("GPTOSS_ATTN_PREFILL_SLIDING", (16, 4, 3, 64))
# Decode launches of up to SMALL_DECODE sequences (batch 1 and the like: latency-bound, a layer's
# kernels back to back under PDL) take the two settings below by default; larger ones keep registers
# for occupancy and the reduce launch, whose cost a batch amortises.
SMALL_DECODE = 8
# GPTOSS_ATTN_REDUCE: how decode's split-K partials are merged. "fused": by the last split program of
# each (sequence, KV head) inside the attention kernel (a ticket, as a split-K semaphore), one launch
# fewer a full layer; "split": by a second launch (the reduce kernel); "small" (default): fused for
# launches of <= SMALL_DECODE sequences, split above. The same arithmetic, so the same bits.
# History: on the H100 (2026-11-26, batch 1) fused lost, 407.7 / 406.9 tok/s against 413.3 / 415.6,
# when its merge took one dependent L2 round trip a split (16 at batch 1). Since the merge loads 8
# splits a tile (attention_reduce.merge_splits, ~3 round trips) it wins: 120b batch 1 on an H200
# (v33, two runs each) 376.5 / 372.7 tok/s against 365.8 / 369.1 with the reduce launch.
REDUCE = _choice_from_env("GPTOSS_ATTN_REDUCE", ("small", "fused", "split"))
# GPTOSS_ATTN_PRELOAD (default 1; 0 turns it off): decode launches of up to SMALL_DECODE sequences
# load each program's first BLOCK_N cached keys and values into registers before the PDL wait
# (PRE_KV), so that tile's table and K/V round trips overlap the QKV projection instead of following
# q's load. Batch 1 at 120b: a full layer's 16 splits hold <= 48 keys each, one or two tiles. The
# same bits; sm_90a: 120 registers against 117 (bench/kernels/pdl_wait_sass.py). 120b batch 1 on an
# H200 (v33): 377.7 / 373.3 tok/s against 365.8 / 369.1; with the fused merge 378.3.
PRELOAD_KV = _choice_from_env("GPTOSS_ATTN_PRELOAD", ("1", "0")) == "1"
# GPTOSS_ATTN_LIVE (default 1; 0 turns it off): with the in-kernel merge, the splits past the last that
# holds keys of the sequence return at once, and the merge reads the live splits' partials only
# (the same bits). At batch 1 under the engine's 4096-key bound v37's 32-key splits launched 64 a full
# layer and a 640-key context filled 20, yet the merge read 64 partials in 8 dependent tiles and 64
# programs drew tickets on one word; at today's 256-key splits a full layer launches 16, 3 of them live.
# H200, random 120b, batch-1 128 -> 512 at 32-key splits (v38): 428.1 / 425.3 tok/s against 414.8 /
# 417.5 without.
LIVE_SPLITS = _choice_from_env("GPTOSS_ATTN_LIVE", ("1", "0")) == "1"
# GPTOSS_ATTN_NEW_KEYS (default 16; 0: the launch's BLOCK_N): the width of a decode's new-keys tile.
# A decode has one new key a sequence, whose softmax step ran over a BLOCK_N-wide tile (256 keys at
# batch 1: two dots, the max and the sum over 255 masked columns); the masked columns' terms are
# exact zeros, so a 16-key tile gives the same bits. H200, random 120b, batch-1 128 -> 512, one process
# (bench/results v42): 466.4-466.8 tok/s against 451.3-453.5 at 0; attention 285.9 -> 222.8 us a token.
NEW_KEYS_N = int(_choice_from_env("GPTOSS_ATTN_NEW_KEYS", ("16", "0", "32", "64")))
# GPTOSS_ATTN_HEADS_FIRST (default 0; 1 turns it on): decode launches on the grid (KV head, split,
# sequence), a sequence's KV heads side by side, instead of (split, sequence, KV head). In the paged
# caches a token's row holds every KV head (20b: 8 x 128 bytes), so in the default order a head's
# programs read 128 bytes of each 1 KB row while the same row's other heads wait for their own
# programs, launched S x splits later. The same bits (each program's work is unchanged). H100 (v72),
# CUDA-graph replays, the default order against FA3: full layers at 8k context B 64 386.8 vs 378.3 us
# (0.98x), B 256 1,499.3 vs 1,482.3 (0.99x), at 93-96 % of the 3.0 TB/s copy; in this order (v73) 387.7 vs
# 378.1 and 1,500.2 vs 1,482.0: 0.5-0.8 % on this tile, more on a 32-key one (FULL_DECODE_BY_GPU below).
HEADS_FIRST = _choice_from_env("GPTOSS_ATTN_HEADS_FIRST", ("0", "1")) == "1"
# Full layers' decode launches of more than SMALL_DECODE sequences on a GPU whose name holds a key here
# take that key's (BLOCK_N, num_warps, num_stages) and launch order (True: heads first) instead of
# DECODE_CFG and HEADS_FIRST; sliding layers and small launches keep theirs. Either variable above
# set (an A/B run) empties the table: its setting then holds for every layer. H100 80GB HBM3, CUDA-graph
# replays (bench/kernels/attn_sweep.py, bench/results v73), us, (64, 2, 3) / (64, 2, 3) heads-first /
# (32, 2, 3) / (32, 2, 3) heads-first / FA3: B 64 at 8k 391.8 / 390.0 / 378.4 / 376.6 / 377.3; B 256 at
# 8k 1,512.5 / 1,505.0 / 1,503.5 / 1,453.6 / 1,479.7; B 256 at 4k 763.4 / 758.4 / 757.3 / 730.9 / 755.1;
# B 1,024 at 1,536 1,143.8 / 1,134.3 / 1,156.1 / 1,100.8 / 1,152.0 (95-99 % of the 3.0 TB/s copy); sliding
# layers there 122.9 / 120.7 / 128.8 / 125.7 (FA3 351.6), so not them. The engine (random 20b, the same
# machine), Offline 1000 x (1024 -> 1024) 21,450.8 tok/s against 21,352.2 (defaults) and 21,477.0 ((64,
# 2, 3) heads-first): the same within a run's spread. On an H200 (64, 2, 3) beat (32, 2, 3) in the
# default order (v43: 803.8 against 857.8 us at B 1,024, 1,536 context), so it keeps the defaults.
FULL_DECODE_BY_GPU: dict[str, tuple[tuple[int, int, int], bool]] = (
    {}
    if os.environ.get("GPTOSS_ATTN_DECODE") or os.environ.get("GPTOSS_ATTN_HEADS_FIRST")
    else {"H100": ((32, 2, 3), True)}
)


def full_decode_setting(
    gpu: str, table: dict[str, tuple[tuple[int, int, int], bool]]
) -> tuple[tuple[int, int, int], bool] | None:
    """The (BLOCK_N, num_warps, num_stages) and heads-first order a large full-layer decode launch takes
    on the GPU named `gpu`, from `table` (FULL_DECODE_BY_GPU): the first key in the name; None: none."""
    return next((v for key, v in table.items() if key in gpu), None)

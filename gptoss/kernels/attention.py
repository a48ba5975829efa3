"""Paged attention with per-head sinks and sliding windows: one Triton kernel for prefill and decode."""

from __future__ import annotations

import os

import torch
import triton
from torch import Tensor

from gptoss.kernels import l2_prefetch, pdl
from gptoss.kernels.attention_kernel import _attn_kernel
from gptoss.kernels.attention_reduce import _reduce_kernel
from gptoss.kernels.attention_rope import rope_operands
from gptoss.kernels.device_info import sm_count
from gptoss.kernels.l2_prefetch import prefetch_l2
from gptoss.kv_dtype import is_fp8

LOG2E = 1.4426950408889634
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
# 256-key tile on 8 warps at 256 (+1.4 % against v37's).
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
    os.environ.get("GPTOSS_ATTN_SMALL_SPLIT_KEYS"), "GPTOSS_ATTN_SMALL_SPLIT_KEYS", 256
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
# (BLOCK_N, num_warps, num_stages): GPTOSS_ATTN_SMALL_DECODE, default (256, 8, 1) with 256-key splits
# (SMALL_SPLIT_KEYS), so a split is one tile that the preload (PRELOAD_KV) loads before the PDL wait:
# at batch 1 a sliding layer's 128-key window is one split (no partials, no merge) and a 640-key
# context 3 live splits of a full layer's 16. None: DECODE_CFG's. H200, random 120b, batch-1 128 ->
# 512, one process, interleaved rounds (bench/results v38, two calls), tok/s: (256, 8, 1) 435.4 /
# 435.9 and 437.2 / 435.0 against DECODE_CFG's 32-key tile at 32-key splits 428.1 / 425.3 and 431.4 /
# 428.7 (attention 291-293 against 329-332 us a token); (64, 4, 2) at 64 keys 429.2 / 432.3; (128,
# 4, 2) 415.7 / 423.0; (128, 8, 2) 413.0 / 419.7; (256, 4, 1) 402.8 / 397.4; (256, 16, 1) 425.5 /
# 429.5; (512, 8, 1) 392.4 / 389.3. Releasing the O projection at each program's end rather than
# after the wait (so its weight preload would not run beside attention's loads) lost: 425.0 / 424.9,
# attention -12 and the projections +69 us a token.
SMALL_DECODE_CFG: tuple[int, int, int] | None = _cfg_from_env("GPTOSS_ATTN_SMALL_DECODE", (256, 8, 1))

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
# Triton 3.6's interpreter multiplies the raw bits of bf16 dot operands; passed to the kernel as
# UPCAST, it makes it upcast dot operands (after the same bf16 rounding) there.
INTERPRETED = bool(triton.knobs.runtime.interpret)
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
MAX_TICKETS = 1 << 16  # (sequence, KV head) pairs one launch can merge in-kernel; more take the reduce
_tickets: dict[torch.device, Tensor] = {}


def reserve_tickets(device: torch.device) -> None:
    """Make the ticket buffer now (a model's init), so CUDA-graph captures later find it made."""
    if REDUCE != "split":
        _ticket_buffer(device, 0)


def _ticket_buffer(device: torch.device, n: int) -> Tensor | None:
    """The zeroed int32 tickets of in-kernel merging on `device`, made once (never while a CUDA graph
    is being captured: memory allocated there belongs to the graph); None where they cannot serve."""
    buf = _tickets.get(device)
    if buf is None:
        if n > MAX_TICKETS or (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            return None
        buf = _tickets[device] = torch.zeros(MAX_TICKETS, dtype=torch.int32, device=device)
    return buf if n <= buf.numel() else None


def decode_splits(
    num_seqs: int, num_kv_heads: int, max_keys: int, num_sms: int = 132, small: bool = False
) -> int:
    """Splits of a decode's key range: enough programs to fill the SMs, each split >= MIN_SPLIT_KEYS
    (small, a launch of <= SMALL_DECODE sequences outside the batch-invariant mode: SMALL_SPLIT_KEYS).

    Depends on shapes and the static key bound only, so a captured CUDA graph stays valid.
    """
    want = triton.cdiv(PROGRAMS_PER_SM * num_sms, num_seqs * num_kv_heads)
    keys = SMALL_SPLIT_KEYS if small else MIN_SPLIT_KEYS
    return max(1, min(want, triton.cdiv(max_keys, keys), MAX_SPLITS))


def paged_attention(
    q: Tensor,
    k_new: Tensor,
    v_new: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_table: Tensor,
    query_start: Tensor,
    context_lens: Tensor,
    sinks: Tensor,
    scale: float,
    window: int | None,
    ring_len: int | None,
    max_query_len: int,
    out: Tensor | None = None,
    max_context_hint: int | None = None,
    batch_invariant: bool = False,
    merge_in_kernel: bool | None = None,
    rope: tuple[Tensor, Tensor, Tensor] | None = None,
    l2_next: Tensor | None = None,
    prefetch_kv: bool = False,
    preload_kv: bool | None = None,
) -> Tensor:
    """Causal attention of S sequences' new tokens over their cached context and themselves.

    q [T, Hq, D]; k_new, v_new [T, Hkv, D] (not yet in the cache); k_cache, v_cache
    [num_blocks, bs, Hkv, D]; block_table [>= S, W] int32 (a full layer's block table, or with
    `ring_len` a sliding layer's ring: position p at ring[(p // bs) % ring_len]); query_start
    [S + 1] int32; context_lens [S] int32 (cached positions = the first new token's position);
    sinks [Hq] float32. Returns out [T, Hq, D] (rows past query_start[S] are left untouched).

    A query at p sees keys (p - window, p]. Each program takes BLOCK_Q tokens x the G query heads
    of one KV head as the M rows of its dots: every K/V tile it loads serves G heads, so K/V are
    read once per KV head rather than once per query head, and M = 16 x 8 = 128 fills a Hopper
    warpgroup MMA; a decode has M = 8 heads padded to 16 (the smallest tl.dot). Key tiles outside
    the tile's window and past its causal limit are never loaded.

    Bytes moved, decode: per sequence Hkv x keys x D x 2 (K, V) x 2 B with keys = min(ctx + 1,
    window), plus q and out (2 x Hq x D x 2 B); split partials add Hq x splits x (D + 2) x 4 B x 2.
    Prefill: q, out and new K/V once, context K/V once per q tile of BLOCK_Q tokens (from L2).

    Decode (max_query_len == 1): grid (splits, S, Hkv), splits from `decode_splits` over
    max_context_hint (default: what the block table can address) and never from context_lens'
    values, so the launch replays in a CUDA graph; splits > 1 add a small reduce kernel.
    Prefill: grid (cdiv(max_query_len, BLOCK_Q), S, Hkv); tiles past a sequence's q_len exit.
    query_start holds absolute rows of q/out, so a mixed step runs as two launches over the same
    q/out with row slices, no rebasing: decodes (table[:n], query_start[:n + 1], context_lens[:n],
    max_query_len 1) on the split-K path, then chunks (table[n:], query_start[n:], ...).
    batch_invariant: decode takes the splits of a lone sequence whatever S is, so a sequence's keys
    fall into the same splits (and sums) alone and in a batch; larger batches then run more
    programs than they need (late splits of short contexts exit at once); the small-launch defaults
    (the in-kernel merge and the preload, chosen by S) are off.
    merge_in_kernel (default from GPTOSS_ATTN_REDUCE, REDUCE): the last split to finish merges the
    partials in the attention kernel, no reduce launch; the same arithmetic, so the same output bits.
    rope (decode launches only) = (positions [T] int, cos_sin [P, D] float32, slot_mapping [T] int):
    q, k_new, v_new are the un-roped projections (views of the QKV output) and the caches lack this
    step's K/V; the kernel ropes q and k as rope_qkv would and stores k, v at slot_mapping (-1: skip),
    so out and the caches hold the bits of rope_qkv(..., caches) + paged_attention (attention_rope).
    l2_next: a tensor the kernels after this call read (the O projection's weight), prefetched into
    L2 by a launch right after the attention kernel's, so that it runs beside it (l2_prefetch).
    prefetch_kv (decode launches with PDL on; GPTOSS_L2_PREFETCH's "kv"): each program prefetches the
    cached K and V rows of its first l2_prefetch.ATTN_KEYS keys into L2 before its PDL wait, while
    the kernel before it still runs. A hint: the output bits are the same.
    preload_kv (default PRELOAD_KV; decode launches of <= SMALL_DECODE sequences): each program
    loads its first BLOCK_N cached keys and values into registers before its PDL wait; the same bits.
    """
    t, hq, d = q.shape
    hkv = k_new.shape[1]
    num_seqs = context_lens.shape[0]
    # batch_invariant: no setting by batch size, so a sequence runs the same launch alone and batched
    small = num_seqs <= SMALL_DECODE and not batch_invariant
    if merge_in_kernel is None:
        merge_in_kernel = REDUCE == "fused" or (REDUCE == "small" and small)
    nb, bs, hkv_c, d_c = k_cache.shape
    if hq % hkv or hkv != hkv_c or d != d_c or v_cache.shape != k_cache.shape:
        raise ValueError(
            f"shapes disagree: q {tuple(q.shape)}, k_new {tuple(k_new.shape)}, cache {tuple(k_cache.shape)}"
        )
    if d & (d - 1) or bs & (bs - 1):
        raise ValueError(f"head_dim {d} and block_size {bs} must be powers of two")
    kv_fp8 = is_fp8(k_cache)
    if not q.dtype == k_new.dtype == v_new.dtype or k_cache.dtype != v_cache.dtype:
        raise ValueError("q, k_new and v_new must share one dtype, and the two caches one")
    if k_cache.dtype != q.dtype and not kv_fp8:
        raise ValueError(f"the caches must be in q's dtype or float8_e4m3fn, got {k_cache.dtype}")
    if kv_fp8 and rope is not None:
        raise ValueError("rope inside attention (GPTOSS_ROPE_IN_ATTN) does not cover a float8 KV cache")
    if (ring_len is not None) and window is None:
        raise ValueError("a ring table (ring_len) needs a window")
    if k_new.stride() != v_new.stride() or k_cache.stride() != v_cache.stride():
        raise ValueError("k and v tensors must have the same strides")
    if any(x.stride(-1) != 1 for x in (q, k_new, k_cache)) or block_table.stride(-1) != 1:
        raise ValueError("the last dim of q, k_new, the caches and the table must be contiguous")
    if query_start.shape[0] != num_seqs + 1:
        raise ValueError("query_start needs S + 1 entries")
    rope = rope_operands(rope, t, d, max_query_len)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device) if out is None else out
    if t == 0 or num_seqs == 0 or max_query_len == 0:
        return out
    g = hq // hkv
    g_pad = triton.next_power_of_2(g)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    qk_scale = scale * LOG2E
    win = window or 0
    common = dict(
        G=g,
        G_PAD=g_pad,
        D=d,
        BS=bs,
        RING=ring_len is not None,
        WINDOWED=window is not None,
        PRECISION=precision,
        UPCAST=INTERPRETED,
    )
    if max_query_len == 1:
        block_n, warps, stages = (SMALL_DECODE_CFG if small else None) or DECODE_CFG
        # float32 q (tests, --dtype float32) halves a 256-key tile: its K, V and roped-key tiles took
        # 262 KB of shared memory against the H200's 227 KB (sm_90a, compiled on CPU; bf16: 106 KB)
        block_n = min(block_n, 512 // q.element_size())
        block_q = max(1, 16 // g_pad)
        max_keys = max_context_hint or block_table.shape[1] * bs
        if window is not None:
            max_keys = min(max_keys, window)
        sms = sm_count(q) if q.is_cuda else 132
        splits = decode_splits(1 if batch_invariant else num_seqs, hkv, max_keys, sms, small)
    else:
        block_n, warps, stages, rows = PREFILL_CFG if window is None else PREFILL_SLIDING_CFG
        block_q = max(1, rows // g_pad)
        splits = 1
    tickets = None
    if splits > 1:
        pm = torch.empty(num_seqs, hq, splits, device=q.device, dtype=torch.float32)
        pl = torch.empty_like(pm)
        pacc = torch.empty(num_seqs, hq, splits, d, device=q.device, dtype=torch.float32)
        if merge_in_kernel:
            tickets = _ticket_buffer(q.device, num_seqs * hkv)
    else:
        pm = pl = pacc = out  # unused
    grid = (triton.cdiv(max_query_len, block_q) * splits, num_seqs, hkv)
    _attn_kernel[grid](
        q,
        k_new,
        v_new,
        k_cache,
        v_cache,
        block_table,
        query_start,
        context_lens,
        sinks,
        out,
        pm,
        pl,
        pacc,
        tickets if tickets is not None else pm,
        *(rope or (context_lens,) * 3),  # positions, cos_sin, slots; unused without rope
        qk_scale,
        win,
        ring_len or 1,
        splits,
        hq,
        q.stride(0),
        q.stride(1),
        k_new.stride(0),
        k_new.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_table.stride(0),
        out.stride(0),
        out.stride(1),
        BLOCK_Q=block_q,
        BLOCK_N=block_n,
        SPLIT=splits > 1,
        MERGE=tickets is not None,
        NS_PAD=triton.next_power_of_2(splits),
        ROPE=rope is not None,
        KV_FP8=kv_fp8,
        PF_KEYS=l2_prefetch.ATTN_KEYS if prefetch_kv and max_query_len == 1 and pdl.on(q) else 0,
        PRE_KV=(PRELOAD_KV if preload_kv is None else preload_kv) and max_query_len == 1 and small,
        LIVE=LIVE_SPLITS and tickets is not None,
        NEW_N=min(NEW_KEYS_N, block_n) if max_query_len == 1 else 0,
        num_warps=warps,
        num_stages=stages,
        **common,
        **pdl.args(q),
    )
    if l2_next is not None:
        prefetch_l2(l2_next)
    if splits > 1 and tickets is None:
        _reduce_kernel[(num_seqs, hkv)](
            query_start,
            sinks,
            out,
            pm,
            pl,
            pacc,
            splits,
            hq,
            out.stride(0),
            out.stride(1),
            G=g,
            G_PAD=g_pad,
            NS_PAD=triton.next_power_of_2(splits),
            D=d,
            # the attention kernel's warps: merge_splits' sums then take the order of the in-kernel
            # merge, whose bits the reduce keeps (at 8 warps against 2 they differed, an H200, v38)
            num_warps=warps,
            **pdl.args(q),
        )
    return out

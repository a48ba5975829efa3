"""Paged attention with per-head sinks and sliding windows: one Triton kernel for prefill and decode."""

from __future__ import annotations

import torch
import triton
from torch import Tensor

from gptoss.kernels import l2_prefetch, pdl
from gptoss.kernels.attention_kernel import _attn_kernel
from gptoss.kernels.attention_reduce import _reduce_kernel
from gptoss.kernels.attention_rope import rope_operands
from gptoss.kernels.attention_settings import (  # read at each launch from here: A/B runs set them
    DECODE_CFG,
    FULL_DECODE_BY_GPU,
    HEADS_FIRST,
    LIVE_SPLITS,
    MAX_SPLITS,
    MIN_SPLIT_KEYS,
    NEW_KEYS_N,
    PREFILL_CFG,
    PREFILL_SLIDING_CFG,
    PRELOAD_KV,
    PROGRAMS_PER_SM,
    REDUCE,
    SMALL_DECODE,
    SMALL_DECODE_CFG,
    SMALL_SPLIT_KEYS,
    full_decode_setting,
)
from gptoss.kernels.device_info import gpu_name, sm_count
from gptoss.kernels.l2_prefetch import prefetch_l2
from gptoss.kv_dtype import is_fp8

LOG2E = 1.4426950408889634
# Triton 3.6's interpreter multiplies the raw bits of bf16 dot operands; passed to the kernel as
# UPCAST, it makes it upcast dot operands (after the same bf16 rounding) there.
INTERPRETED = bool(triton.knobs.runtime.interpret)
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


def decode_key_bound(hint: int, window: int | None) -> int:
    """The static bound on a decode's keys that its split count follows: the context hint, or the
    window on a sliding layer."""
    return hint if window is None else min(hint, window)


def decode_sms(t: Tensor) -> int:
    """The SMs a decode launch fills: the device's, or an H100 / H200's 132 off CUDA (interpreter)."""
    return sm_count(t) if t.is_cuda else 132


def decode_group_sizes(
    max_seqs: int, num_kv_heads: int, max_keys: tuple[int, ...], num_sms: int
) -> list[int]:
    """The first decode launch size S in 1..max_seqs of each distinct kernel specialization that S
    selects, over layers whose key bounds are `max_keys` (full: the context hint; sliding: the
    window): split count padded (NS_PAD), the small-launch settings, and the split count as Triton
    specializes an int (1, a multiple of 16, else). For a warm-up to compile them all (gptoss.warmup)."""
    seen: set[tuple] = set()
    sizes = []
    for s in range(1, max_seqs + 1):
        small = s <= SMALL_DECODE
        splits = [decode_splits(s, num_kv_heads, k, num_sms, small) for k in max_keys]
        key = (small, *((triton.next_power_of_2(n), n == 1, n % 16 == 0) for n in splits))
        if key not in seen:
            seen.add(key)
            sizes.append(s)
    return sizes


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

    Decode (max_query_len == 1): grid (splits, S, Hkv), or (Hkv, splits, S) with HEADS_FIRST (and on
    full layers where FULL_DECODE_BY_GPU names the GPU, for launches of more than SMALL_DECODE); splits
    from `decode_splits` over max_context_hint (default: what the block table can address) and
    never from context_lens' values, so the launch replays in a CUDA graph; splits > 1 add a small
    reduce kernel.
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
    heads_first = HEADS_FIRST and max_query_len == 1  # decode only: prefill keeps its q tiles first
    if max_query_len == 1:
        block_n, warps, stages = (SMALL_DECODE_CFG if small else None) or DECODE_CFG
        if window is None and not small and (dev := full_decode_setting(gpu_name(q), FULL_DECODE_BY_GPU)):
            (block_n, warps, stages), heads_first = dev
        # float32 q (tests, --dtype float32) halves a 256-key tile: its K, V and roped-key tiles took
        # 262 KB of shared memory against the H200's 227 KB (sm_90a, compiled on CPU; bf16: 106 KB)
        block_n = min(block_n, 512 // q.element_size())
        block_q = max(1, 16 // g_pad)
        max_keys = decode_key_bound(max_context_hint or block_table.shape[1] * bs, window)
        splits = decode_splits(1 if batch_invariant else num_seqs, hkv, max_keys, decode_sms(q), small)
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
    if heads_first:
        grid = (hkv, grid[0], num_seqs)
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
        HEADS_FIRST=heads_first,
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

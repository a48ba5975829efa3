"""Top-k / top-p filtering for gptoss.kernels.sampling.sample: which logits of each row may be drawn.

Three forms of one rule (gptoss.sampler's: top-k first, then top-p's smallest prefix of the stable
descending order whose mass reaches top_p; greedy and unfiltered rows untouched; NaN stays NaN):
mask_top_k_top_p sorts the vocabulary; mask_within_top_k finds the same prefix from a per-row top-k
when every filtered row asks a small top_k (top_k_cap says when, on the host); filter_cut gives that
prefix as a (tau, cut) pair the draw applies while it reads the row (sampling.USE_CUT) or apply_cut
copies. A top-p-only row's prefix: sampling_top_p.top_p_cut (TOP_P_SEARCH; filter_plan says when).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

_BLOCK = 1024  # elements per loop step of the tie count and the cut scan, at the most


def mask_top_k_top_p(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """logits [B, V] -> a copy with -inf outside each sampled row's top-k, then top-p, set.

    Same rule as gptoss.sampler: top-k first; then top-p keeps the smallest prefix (by descending
    prob of softmax(logits/T) over the top-k) whose mass reaches top_p. Greedy rows and rows with
    top_k == 0 and top_p >= 1 are left untouched, so they pick exactly what the unfiltered path
    picks. A stable sort ranks ties by index, so top_k=1 keeps the first maximum. NaN stays NaN.
    Cost: a [B, V] sort plus a few [B, V] passes (~10 bytes/elt each) and ~4 [B, V] temporaries.
    """
    V = logits.shape[1]
    sampled = temperature > 0  # [B]
    vals, ids = logits.sort(dim=-1, descending=True, stable=True)  # [B, V] each
    rank = torch.arange(V, device=logits.device)  # [V]
    k = torch.where(sampled & (top_k > 0), top_k.to(torch.int64), V)  # [B]
    out_k = rank[None, :] >= k[:, None]  # [B, V]
    vals = vals.masked_fill(out_k, float("-inf"))
    t = torch.where(sampled, temperature, 1.0)  # [B]
    probs = torch.softmax(vals / t[:, None], dim=-1)  # [B, V]
    p = torch.where(sampled & (top_p < 1), top_p, float("inf"))  # [B]
    # Drop a token once the mass strictly before it already reaches top_p.
    drop_sorted = out_k | ((probs.cumsum(-1) - probs) >= p[:, None])  # [B, V]
    drop = torch.empty_like(drop_sorted).scatter_(1, ids, drop_sorted)  # [B, V] in vocab order
    return logits.masked_fill(drop & ~torch.isnan(logits), float("-inf"))


# The most top_k a batch may ask for and still be filtered by mask_within_top_k (a top-k of this many
# per row, not a sort of the vocabulary); past it, or with a pure top-p row, mask_top_k_top_p sorts.
TOP_K_FAST_MAX = 1024


def top_k_cap(top_ks: list[int], filtered: list[bool]) -> int:
    """The k_cap that lets sample() take mask_within_top_k for a batch (host values, no device
    work): the largest top_k of its filtered rows when every one of them has 0 < top_k <=
    TOP_K_FAST_MAX, else 0 (a row with top_p alone can keep most of the vocabulary)."""
    ks = [k for k, f in zip(top_ks, filtered, strict=True) if f]
    return max(ks) if ks and all(0 < k <= TOP_K_FAST_MAX for k in ks) else 0


# sample() finds a top-p-only row's kept set by sampling_top_p.top_p_cut's search instead of the
# vocabulary sort: the same tokens (tests). A 20b decode on an H200 (bench/sampling_gpu.sh, v66),
# top_p 0.9, the cut drawn as read: 1.06x / 1.15x / 1.48x the sort's tok/s at batch 1 / 64 / 256.
TOP_P_SEARCH = True


def filter_plan(top_ks: list[int], filtered: list[bool]) -> tuple[int, bool]:
    """(k_cap, top_p_search) for sample(), from host values: top_k_cap's, unless TOP_P_SEARCH is on
    and the batch's filtered rows mix top_p alone (top_k 0) with top_k <= TOP_K_FAST_MAX: then the
    largest top_k (0 if none) and True, the top-p-only rows searched, the others by filter_cut."""
    cap = top_k_cap(top_ks, filtered)
    ks = [k for k, f in zip(top_ks, filtered, strict=True) if f]
    if cap or not TOP_P_SEARCH or not ks or any(k > TOP_K_FAST_MAX for k in ks):
        return cap, False
    return max(ks), True


def apply_cut(logits: Tensor, tau: Tensor, cut: Tensor) -> Tensor:
    """A masked copy of logits [B, V] keeping what a (tau [B], cut [B]) pair keeps (filter_cut's,
    top_p_cut's): the logits above tau, those equal to it at an index <= cut, and NaN."""
    idx = torch.arange(logits.shape[1], device=logits.device)[None, :]
    tau, cut = tau[:, None], cut[:, None]
    keep = (logits > tau) | ((logits == tau) & (idx <= cut)) | torch.isnan(logits)
    return logits.masked_fill(~keep, float("-inf"))


def _top_k_prefix(
    logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, k_cap: int
) -> tuple[Tensor, Tensor, Tensor]:
    """The kept prefix of each row as (filtered [B, 1] bool, tau [B, 1], ties [B, 1] int64): the
    last kept value and how many logits equal to it stay, by index (see mask_within_top_k)."""
    kmax = min(k_cap, logits.shape[1])
    sampled = temperature > 0  # [B]
    k = torch.where(sampled & (top_k > 0), top_k.to(torch.int64).clamp(max=kmax), 0)  # [B] 0: untouched
    vals = logits.topk(kmax, dim=-1).values  # [B, kmax] descending, NaN first as in the sort
    in_k = torch.arange(kmax, device=logits.device)[None, :] < k[:, None]  # [B, kmax]
    t = torch.where(sampled, temperature, 1.0)  # [B]
    probs = torch.softmax(vals.masked_fill(~in_k, float("-inf")) / t[:, None], dim=-1)  # [B, kmax]
    p = torch.where(sampled & (top_p < 1), top_p, float("inf"))  # [B]
    # The kept positions are a prefix (the mass before a position never falls): n of them.
    n = (in_k & ((probs.cumsum(-1) - probs) < p[:, None])).sum(-1, keepdim=True)  # [B, 1]
    tau = vals.gather(1, (n - 1).clamp(min=0))  # [B, 1] the last kept value (n = 0: none is kept)
    ties = n - (vals > tau).sum(-1, keepdim=True)  # [B, 1] how many logits equal to tau stay
    return (k > 0)[:, None], tau, ties


def mask_within_top_k(
    logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, k_cap: int
) -> Tensor:
    """mask_top_k_top_p's result for a batch whose filtered rows all have 0 < top_k <= k_cap (rows
    with top_k == 0 must have top_p >= 1: top_k_cap says when), without sorting the vocabulary.

    The rule keeps a prefix of the stable descending order, which a top-k of k_cap values per row
    holds: its length n (top-k, then top-p's mass over the k softmax-ed values, summed in that same
    order) names the last kept value tau, and the kept set is every logit above tau plus the first
    n - #(above tau) logits equal to tau by index (where the stable sort put ties). So the same
    tokens go, up to the float32 rounding of the softmax's sum (k terms here, V with zeros there).
    Cost: a top-k and ~10 elementwise [B, V] passes (masks, an int32 cumsum, the masked copy) against
    a [B, V] sort: 1.35-2.79x faster on an H200 at B 1-1024 (bench/results v64).
    """
    filtered, tau, ties = _top_k_prefix(logits, temperature, top_k, top_p, k_cap)
    eq = logits == tau  # [B, V]
    keep = (logits > tau) | (eq & (eq.cumsum(-1, dtype=torch.int32) <= ties))  # ties by index
    return logits.masked_fill(filtered & ~keep & ~torch.isnan(logits), float("-inf"))


@triton.jit
def nth_equal(row_ptr, tau, n, start, end, BLOCK: tl.constexpr):
    """In index order over [start, end) of a row: the index of its n-th (from 1) value equal to tau
    (the last one if fewer; -1: none, or n < 1). The cut of a tie run: filter_cut's, top_p_cut's."""
    lanes = tl.arange(0, BLOCK)
    seen = 0
    at = -1
    for s in range(start, end, BLOCK):
        x = tl.load(row_ptr + s + lanes, mask=s + lanes < end, other=float("nan"))
        eq = (x == tau).to(tl.int32)
        rank = tl.cumsum(eq, axis=0) + seen  # 1-based among the ties so far
        at = tl.maximum(at, tl.max(tl.where((eq > 0) & (rank <= n), s + lanes, -1), axis=0))
        seen += tl.sum(eq, axis=0)
    return at


@triton.jit
def nth_equal_in_chunks(row_ptr, tau, n, cnt_c, V, CHUNK, BLOCK: tl.constexpr, CHUNKS: tl.constexpr):
    """The index of a row's n-th (from 1, at most their total) value equal to tau, from cnt_c [CHUNKS]
    (how many each CHUNK-wide chunk holds): a scan of the one chunk holding it. filter_cut's and
    top_p_cut's cut."""
    c = tl.arange(0, CHUNKS)
    at = tl.min(tl.where(tl.cumsum(cnt_c, axis=0) >= n, c, CHUNKS), axis=0)
    rank = n - tl.sum(tl.where(c < at, cnt_c, 0), axis=0)  # its rank among that chunk's ties
    return nth_equal(row_ptr, tau, rank, at * CHUNK, tl.minimum(at * CHUNK + CHUNK, V), BLOCK)


@triton.jit
def _tie_count_kernel(logits_ptr, stride_row, tau_ptr, cnt_ptr, V, n_chunks, CHUNK, BLOCK: tl.constexpr):
    """Chunk program_id(1) of row program_id(0) -> how many of its logits equal the row's tau."""
    row = tl.program_id(0).to(tl.int64)
    ch = tl.program_id(1)
    tau = tl.load(tau_ptr + row)
    lanes = tl.arange(0, BLOCK)
    n = tl.zeros([BLOCK], tl.int32)
    end = tl.minimum(ch * CHUNK + CHUNK, V)
    for s in range(ch * CHUNK, end, BLOCK):
        x = tl.load(logits_ptr + row * stride_row + s + lanes, mask=s + lanes < end, other=float("nan"))
        n += (x == tau).to(tl.int32)
    tl.store(cnt_ptr + row * n_chunks + ch, tl.sum(n, axis=0))


@triton.jit
def _cut_index_kernel(
    logits_ptr,
    stride_row,
    tau_ptr,
    ties_ptr,
    cnt_ptr,
    cut_ptr,
    V,
    n_chunks,
    CHUNK,
    BLOCK: tl.constexpr,
    CHUNKS: tl.constexpr,
):
    """One row a program: the index of its ties-th logit equal to tau (the last if fewer; -1: none),
    from the chunks' tie counts and a scan of the one chunk that holds it."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, CHUNKS)
    cnt_c = tl.load(cnt_ptr + row * n_chunks + c, mask=c < n_chunks, other=0)
    n = tl.minimum(tl.load(ties_ptr + row).to(tl.int32), tl.sum(cnt_c, axis=0))
    cut = -1
    if n > 0:
        row_ptr = logits_ptr + row * stride_row
        cut = nth_equal_in_chunks(row_ptr, tl.load(tau_ptr + row), n, cnt_c, V, CHUNK, BLOCK, CHUNKS)
    tl.store(cut_ptr + row, cut)


MIN_CHUNK = 2048


def chunk_size(b: int, v: int) -> int:
    """Logits a program of a [B, chunks] row kernel: aim for >= ~1000 programs (132 SMs), chunks of
    2K..16K logits (a multiple of the kernels' blocks)."""
    return min(16384, max(MIN_CHUNK, triton.next_power_of_2(triton.cdiv(b * v, 1024))))


def chunks_bound(v: int, chunk: int) -> int:
    """The kernels' CHUNKS constexpr (a power of two >= the chunks of a row): the same for every
    chunk_size, so one compile serves every batch size (a warm-up's or the precompile manifest's);
    the loads beyond a row's chunks are masked off."""
    return triton.next_power_of_2(triton.cdiv(v, min(chunk, MIN_CHUNK)))


def filter_cut(
    logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, k_cap: int, chunk: int = 0
) -> tuple[Tensor, Tensor]:
    """mask_within_top_k's kept set as a cut that gumbel_argmax applies while it reads: (tau [B]
    float32, cut [B] int32), keeping the logits above tau and those equal to it at an index <= cut
    (untouched rows: -inf and V). The ties are counted by [B, chunks] programs and the cut found in
    the one chunk that holds it, instead of the masks and the masked copy (a single program a row
    scanning it whole took 131 us at B 1 on an H200, v66). chunk: logits a program (0: chunk_size's;
    a power of two; tests pass small ones). (USE_CUT turns it on in sample().)"""
    b, v = logits.shape
    filtered, tau, ties = _top_k_prefix(logits, temperature, top_k, top_p, k_cap)
    tau, ties = tau.squeeze(1).contiguous(), ties.squeeze(1).contiguous()
    cut = torch.empty(b, dtype=torch.int32, device=logits.device)
    if b:
        chunk = chunk or chunk_size(b, v)
        block = min(_BLOCK, triton.next_power_of_2(v), chunk)
        n = triton.cdiv(v, chunk)
        cnt = torch.empty(b, n, dtype=torch.int32, device=logits.device)
        row = (logits, logits.stride(0), tau)
        _tie_count_kernel[(b, n)](*row, cnt, v, n, chunk, BLOCK=block)
        _cut_index_kernel[(b,)](*row, ties, cnt, cut, v, n, chunk, BLOCK=block, CHUNKS=chunks_bound(v, chunk))
    keep_all = ~filtered.squeeze(1)
    tau = torch.where(keep_all, float("-inf"), tau)
    return tau, torch.where(keep_all, v, cut).to(torch.int32)

"""Next-token sampling on the device, no host sync: sample() filters the rows that ask for top-k /
top-p (gptoss.kernels.sampling_filter, gptoss.kernels.sampling_top_p) and draws every row by
Gumbel-max (gptoss.kernels.sampling_draw)."""

from __future__ import annotations

import torch
from torch import Tensor

from gptoss.kernels.sampling_draw import gumbel_argmax
from gptoss.kernels.sampling_filter import apply_cut, filter_cut, mask_top_k_top_p, mask_within_top_k
from gptoss.kernels.sampling_top_p import top_p_cut

# sample() applies a filter's (tau, cut) as the draw reads the row (filter_cut's for a k_cap batch,
# top_p_cut's for a searched one) instead of a masked copy (mask_within_top_k, apply_cut): the same
# draws (tests). A 20b decode on an H200 (bench/sampling_gpu.sh, v66), top_p 0.9: +3.5 / +4.1 / +6.0 %
# at batch 1 / 64 / 256 over the searched masked copy; top_k 50 + top_p 0.9: see v66.
USE_CUT = True
# Rows the vocabulary sort (mask_top_k_top_p) takes at a time. Its temporaries are ~25-30 bytes a
# logit (values, int64 ids, probabilities, their cumsum, masks; bench/sampling_memory.py: 25.1 on
# CPU), 6 GB for 1024 rows of 201,088: more than a step's workspace keeps (step_workspace_bytes: one masked
# float32 copy and the activations, free by the draw). 128 rows keep them under 0.8 GB, at a cost
# of 1.35x / 1.39x the one-call sort at B 256 / 1024 (an H200, v66). Only rows with a top_k above
# sampling_filter.TOP_K_FAST_MAX sort since the top-p search (v66), so memory wins here.
SORT_ROWS = 128


def sample(
    logits: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    seeds: Tensor,
    offsets: Tensor,
    *,
    filtered: bool,
    k_cap: int = 0,
    top_p_search: bool = False,
    rows: Tensor | None = None,
) -> Tensor:
    """logits [B, V] float32 or bfloat16; temperature, top_p [B] f32; top_k [B] int; seeds, offsets
    [B] int64. bfloat16 logits (lm_head's own dtype) are drawn unfiltered as they are, the ids of
    their float32 copy (exact) without making it; the filters take float32 (the rows they filter
    are widened here).

    Returns ids [B] int64. temperature 0 = greedy (first index of the maximum); top_k 0 = off.
    `filtered` says (host-side, from the request params) whether any row has top_k > 0 or
    top_p < 1; when False those columns are ignored. k_cap > 0 (top_k_cap's, host-side too) filters
    by mask_within_top_k instead of sorting the vocabulary: the same draws. top_p_search
    (sampling_filter.filter_plan's): the rows with top_k 0 by top_p_cut's search, the others by
    filter_cut at k_cap (k_cap >= every top_k). rows (int64 [R] on the device, host-chosen): the
    only rows that need filtering; the others are drawn unfiltered, the same ids (a row's draw
    depends on its own logits and params alone) without filtering B rows for R. A row with a NaN
    logit yields -1. No host sync: safe in a CUDA graph.
    """
    if logits.dim() != 2 or logits.dtype not in (torch.float32, torch.bfloat16) or logits.stride(1) != 1:
        raise ValueError(
            f"logits must be float32 or bfloat16 [B, V] with a contiguous last dim, got "
            f"{logits.dtype} {tuple(logits.shape)} strides {logits.stride()}"
        )
    B = logits.shape[0]
    for name, x, dtypes in (
        ("temperature", temperature, (torch.float32,)),
        ("top_k", top_k, (torch.int32, torch.int64)),
        ("top_p", top_p, (torch.float32,)),
        ("seeds", seeds, (torch.int64,)),
        ("offsets", offsets, (torch.int64,)),
    ):
        if x.shape != (B,) or x.dtype not in dtypes or x.device != logits.device:
            raise ValueError(
                f"{name} must be [{B}] {dtypes} on {logits.device}, got "
                f"{tuple(x.shape)} {x.dtype} on {x.device}"
            )
    params = (temperature.contiguous(), top_k, top_p, seeds.contiguous(), offsets.contiguous())
    if not filtered:
        return gumbel_argmax(logits, params[0], params[3], params[4])
    if rows is None:
        return _draw_filtered(logits.float(), params, k_cap, top_p_search)
    if rows.dim() != 1 or rows.dtype != torch.int64 or rows.device != logits.device:
        raise ValueError(f"rows must be int64 [R] on {logits.device}, got {tuple(rows.shape)} {rows.dtype}")
    ids = gumbel_argmax(logits, params[0], params[3], params[4])  # the filtered rows' ids replaced below
    some = tuple(x.index_select(0, rows) for x in params)
    some_logits = logits.index_select(0, rows).float()
    return ids.index_copy_(0, rows, _draw_filtered(some_logits, some, k_cap, top_p_search))


def _draw_filtered(logits: Tensor, params: tuple[Tensor, ...], k_cap: int, top_p_search: bool) -> Tensor:
    """sample()'s filtered draw of every row of logits: its filter (as sample() says), then the draw.
    params: the rows' (temperature, top_k, top_p, seeds, offsets)."""
    temperature, top_k, top_p, seeds, offsets = params
    cut = None
    if top_p_search:
        cut = _searched_cut(logits, temperature, top_k, top_p, k_cap)
        if not USE_CUT:
            logits, cut = apply_cut(logits, *cut), None
    elif k_cap > 0 and USE_CUT:
        cut = filter_cut(logits, temperature, top_k, top_p, k_cap)
    elif k_cap > 0:
        logits = mask_within_top_k(logits, temperature, top_k, top_p, k_cap)
    elif logits.shape[0] <= SORT_ROWS:
        logits = mask_top_k_top_p(logits, temperature, top_k, top_p)
    else:  # in blocks of rows: each row's mask is its own
        masked = torch.empty_like(logits)
        for a in range(0, logits.shape[0], SORT_ROWS):
            b = slice(a, a + SORT_ROWS)
            masked[b] = mask_top_k_top_p(logits[b], temperature[b], top_k[b], top_p[b])
        logits = masked
    return gumbel_argmax(logits, temperature, seeds, offsets, cut)


def _searched_cut(
    logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, k_cap: int
) -> tuple[Tensor, Tensor]:
    """Each filtered row's (tau, cut): top_p_cut's for rows with top_k 0 (the others left whole by
    it), filter_cut's for the rest (which leaves the top_k 0 rows whole)."""
    only_p = top_k <= 0
    tau, cut = top_p_cut(logits, temperature, torch.where(only_p, top_p, 1.0))
    if k_cap > 0:
        tau_k, cut_k = filter_cut(logits, temperature, top_k, top_p, k_cap)
        tau, cut = torch.where(only_p, tau, tau_k), torch.where(only_p, cut, cut_k)
    return tau, cut

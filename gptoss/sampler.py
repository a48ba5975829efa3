"""Next-token choice for a batch: greedy rows take the argmax, the others draw from their own stream.

Each sampled row uses one uniform number from its request's private `random.Random` and
inverts the CDF of its (temperature, top-k, top-p filtered) distribution. The draw thus depends
only on the request's seed and its own logits, never on its neighbours in the batch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gptoss.sequence import Sequence


def sample(logits: Tensor, seqs: list[Sequence]) -> list[int]:
    """logits [B, V] float32, one row per seq → B token ids."""
    drawn = [i for i, s in enumerate(seqs) if s.rng is not None]
    if not drawn:
        return argmax(logits).tolist()
    out = torch.empty(len(seqs), dtype=torch.int64, device=logits.device)
    if len(drawn) < len(seqs):
        greedy = torch.tensor([i for i, s in enumerate(seqs) if s.rng is None], device=logits.device)
        out[greedy] = argmax(logits[greedy])
    idx = torch.tensor(drawn, device=logits.device)
    out[idx] = _draw(logits[idx], [seqs[i] for i in drawn])
    return out.tolist()


def argmax(x: Tensor, block: int = 256) -> Tensor:
    """x [B, V] → [B] first index of each row's maximum; raises on NaN rather than pick garbage.

    Tensor.argmax over a 201k vocabulary runs scalar on CPU (~10x slower than amax); taking
    block maxima first, then the argmax inside the winning block, gives the same index.
    """
    b, v = x.shape
    n = v // block
    head = x[:, : n * block].unflatten(1, (n, block))  # [B, n, block], a view
    bmax = head.amax(-1)  # [B, n]
    j = bmax.argmax(-1)  # [B] first block holding the maximum
    best = bmax.gather(1, j[:, None]).squeeze(1)  # [B]
    idx = j * block + head[torch.arange(b, device=x.device), j].argmax(-1)
    if n * block < v:  # the tail wins only when strictly larger: ties keep the first index
        tail = x[:, n * block :]
        tmax, targ = tail.max(-1)
        idx = torch.where(tmax > best, n * block + targ, idx)
        best = torch.maximum(best, tmax)
    if torch.isnan(best).any():
        raise RuntimeError("the model produced NaN logits")
    return idx


def _draw(logits: Tensor, seqs: list[Sequence]) -> Tensor:
    """logits [N, V] → [N] ids sampled per each seq's params and stream."""
    dev = logits.device
    temps = torch.tensor([s.params.temperature for s in seqs], dtype=torch.float32, device=dev)
    logits = logits.float() / temps[:, None]
    top_k = [s.params.top_k for s in seqs]
    top_p = [s.params.top_p for s in seqs]
    u = torch.tensor([s.rng.random() for s in seqs], dtype=torch.float64, device=dev)  # [N]
    if any(top_k) or any(p < 1.0 for p in top_p):
        return _draw_filtered(logits, top_k, top_p, u)
    probs = torch.softmax(logits, -1)  # [N, V]
    return _invert(probs, u)


def _invert(probs: Tensor, u: Tensor) -> Tensor:
    """The first index whose cumulative probability exceeds u * total (float64 keeps the tail exact)."""
    cdf = probs.double().cumsum_(-1)  # [N, V]
    if torch.isnan(cdf[:, -1]).any():
        raise RuntimeError("the model produced NaN logits")
    target = (u * cdf[:, -1])[:, None]  # [N, 1]
    idx = torch.searchsorted(cdf, target, right=True).squeeze(1)
    # u * total can equal total only by rounding; never step past the last token with mass.
    return idx.clamp_(max=probs.shape[-1] - 1)


def _draw_filtered(logits: Tensor, top_k: list[int], top_p: list[float], u: Tensor) -> Tensor:
    vocab = logits.shape[-1]
    k_max = max(k if k > 0 else vocab for k in top_k)
    # Only the k_max best logits can survive either filter when every row has a top-k.
    vals, ids = logits.topk(k_max, -1) if k_max < vocab else logits.sort(-1, descending=True)  # [N, K]
    rank = torch.arange(vals.shape[-1], device=logits.device)
    ks = torch.tensor([k if k > 0 else vocab for k in top_k], device=logits.device)
    vals = vals.masked_fill(rank[None] >= ks[:, None], float("-inf"))
    probs = torch.softmax(vals, -1)  # [N, K], sorted descending
    ps = torch.tensor(top_p, dtype=probs.dtype, device=logits.device)
    # Keep the smallest prefix whose mass reaches top_p: drop a token when the mass before it does.
    before = probs.cumsum(-1) - probs
    probs = probs.masked_fill(before >= ps[:, None], 0.0)
    return ids.gather(1, _invert(probs, u)[:, None]).squeeze(1)

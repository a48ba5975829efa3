"""Dense reference attention with per-head sinks; an AttentionFn for one sequence over a plain KV cache."""

from __future__ import annotations

import torch
from torch import Tensor


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    sinks: Tensor,
    window: int | None,
    scale: float,
    q_pos: Tensor,
    k_pos: Tensor,
) -> Tensor:
    """Causal (optionally sliding-window) attention of queries over keys of ONE sequence.

    q [T, Hq, D]; k, v [S, Hkv, D]; sinks [Hq]; q_pos [T], k_pos [S] absolute positions.
    Key j is visible to query i when k_pos[j] <= q_pos[i] and, with a window,
    q_pos[i] - k_pos[j] < window (a window of 128 sees the token itself and 127 before it).
    Each head's sink logit joins the softmax denominator and takes no value. Computed in float32.
    Returns [T, Hq, D] in q's dtype.
    """
    T, Hq, D = q.shape
    S, Hkv, _ = k.shape
    G = Hq // Hkv  # query heads per KV head
    qf = q.float().view(T, Hkv, G, D)
    scores = torch.einsum("tkgd,skd->kgts", qf, k.float()) * scale  # [Hkv, G, T, S]
    dist = q_pos[:, None] - k_pos[None, :]  # [T, S]
    visible = dist >= 0
    if window is not None:
        visible &= dist < window
    scores = scores.masked_fill(~visible, float("-inf"))
    sink = sinks.float().view(Hkv, G, 1, 1).expand(Hkv, G, T, 1)
    probs = torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1)[..., :S]  # [Hkv, G, T, S]
    out = torch.einsum("kgts,skd->tkgd", probs, v.float())  # [T, Hkv, G, D]
    return out.reshape(T, Hq, D).to(q.dtype)


class DenseAttention:
    """AttentionFn for ONE sequence: a contiguous per-layer KV cache that keeps every position.

    Each call appends the new keys/values of `layer` and attends the new queries, which sit at the
    positions right after the cached ones, so a prefill followed by single-token decode steps must
    give the same outputs as one forward over the whole sequence.
    """

    def __init__(self) -> None:
        self.k: dict[int, Tensor] = {}  # layer -> [S, Hkv, D]
        self.v: dict[int, Tensor] = {}

    def __len__(self) -> int:
        """Number of cached positions (those of layer 0)."""
        return 0 if 0 not in self.k else self.k[0].shape[0]

    def __call__(
        self, layer: int, q: Tensor, k: Tensor, v: Tensor, sinks: Tensor, window: int | None, scale: float
    ) -> Tensor:
        if layer in self.k:
            k = torch.cat((self.k[layer], k))
            v = torch.cat((self.v[layer], v))
        self.k[layer], self.v[layer] = k, v
        S, T = k.shape[0], q.shape[0]
        k_pos = torch.arange(S, device=q.device)
        return attention(q, k, v, sinks, window, scale, k_pos[S - T :], k_pos)

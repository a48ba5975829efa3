"""PagedAttention against the dense reference attention on random q/k/v, chunk by chunk."""

from __future__ import annotations

import random

import pytest
import torch

from gptoss.attention_ref import attention
from gptoss.block_manager import BlockManager
from gptoss.paged_attention import PagedAttention, StepContext
from gptoss.sampling import SamplingParams
from gptoss.sequence import Sequence

HQ, HKV, D = 4, 2, 16


@pytest.mark.parametrize("block_size, window", [(16, 128), (4, 10), (5, 12)])
def test_paged_equals_dense_over_chunked_prefill_and_decode(block_size, window):
    torch.manual_seed(0)
    rng = random.Random(block_size)
    layers = [window, None]  # one sliding layer, one full layer
    bm = BlockManager(num_full_blocks=400, block_size=block_size, window=window)
    attn = PagedAttention(
        layers, bm.full.num_blocks, bm.ring.num_blocks, block_size, HKV, D, torch.float32, torch.device("cpu")
    )
    lengths = [3, 40, 1, 140, 36, 50]
    seqs = [
        Sequence(i, str(i), [0] * n, SamplingParams(max_new_tokens=30), 10_000) for i, n in enumerate(lengths)
    ]
    history = {s.seq_id: {layer: ([], []) for layer in range(2)} for s in seqs}  # K/V chunks per seq
    done = {s.seq_id: 0 for s in seqs}  # positions with K/V in the cache
    sinks = torch.randn(HQ)
    kinds = {}  # (group kind, several sequences, padded) seen
    for _ in range(200):
        # Each live seq feeds a random chunk of its remaining tokens (decodes: exactly one).
        live = [s for s in seqs if done[s.seq_id] < s.num_tokens or s.num_tokens < s.num_prompt_tokens + 25]
        if not live:
            break
        news = []
        for s in live:
            left = s.num_tokens - done[s.seq_id]
            if left == 0:  # prompt done: decode one new token per step
                s.token_ids.append(0)
                left = 1
            # Often 10 or 12 tokens, so chunks of several sequences batch (padded) together.
            news.append(rng.choice([rng.randint(1, left), min(left, rng.choice([10, 12]))]))
        order = sorted(range(len(live)), key=lambda i: news[i] != 1)
        live, news = [live[i] for i in order], [news[i] for i in order]
        starts = [done[s.seq_id] for s in live]
        for s, a, n in zip(live, starts, news, strict=True):
            bm.allocate(s, a + n)
        attn.ctx = StepContext.build(
            starts,
            news,
            [s.full_blocks for s in live],
            [s.ring_blocks for s in live],
            block_size,
            window,
            HKV,
            torch.device("cpu"),
        )
        t = sum(news)
        for g in attn.ctx.groups:
            kinds[("decode" if g.qlen == 1 else "prefill", g.batch > 1, g.pad_src is not None)] = True
        for layer, w in enumerate(layers):
            q, k, v = torch.randn(t, HQ, D), torch.randn(t, HKV, D), torch.randn(t, HKV, D)
            out = attn(layer, q, k, v, sinks, w, 0.25)
            row = 0
            for s, a, n in zip(live, starts, news, strict=True):
                ks, vs = history[s.seq_id][layer]
                ks.append(k[row : row + n])
                vs.append(v[row : row + n])
                kk, vv = torch.cat(ks), torch.cat(vs)
                pos = torch.arange(a + n)
                want = attention(q[row : row + n], kk, vv, sinks, w, 0.25, pos[a:], pos)
                torch.testing.assert_close(out[row : row + n], want, rtol=1e-5, atol=1e-5)
                row += n
        for s, n in zip(live, news, strict=True):
            done[s.seq_id] += n
    # Every sequence decoded 25 tokens after its prompt; the longest ran well past the window.
    assert all(done[s.seq_id] == s.num_tokens == s.num_prompt_tokens + 25 for s in seqs)
    assert done[3] > window
    # Batched decodes, lone prefill chunks and padded multi-sequence prefill groups all ran.
    assert {("decode", True, False), ("prefill", False, False), ("prefill", True, True)} <= set(kinds)

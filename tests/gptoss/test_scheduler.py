"""Scheduler + block manager under random load: invariants, preemption, no leaks (no model needed)."""

import random

import pytest
import torch

from gptoss.block_manager import BlockManager, cdiv
from gptoss.paged_attention import StepContext
from gptoss.sampling import SamplingParams
from gptoss.scheduler import Scheduler
from gptoss.sequence import Sequence, Status

STOP = (200002, 200012, 199999)


def make_seq(i, prompt_len, max_new, max_model_len=4096, ignore_eos=False):
    params = SamplingParams(max_new_tokens=max_new, temperature=0.0, ignore_eos=ignore_eos)
    return Sequence(i, f"r{i}", [7] * prompt_len, params, max_model_len)


class KVShadow:
    """What each cache row should hold, (seq_id, position), to check the step's index tensors.

    Prefill chunks read their context before the step's writes; decodes read after them, so
    their context ends with their own new token. One KV head, so cache rows are slots.
    """

    def __init__(self, bm, window):
        # A shared pool is one storage for both kinds: a row either kind wrote may be reused by the other.
        self.pool = dict.fromkeys(("full", "ring"), {}) if bm.shared else {"full": {}, "ring": {}}
        self.bs = bm.block_size
        self.window = window

    def expect(self, seq, kind, ix, b, end):
        """Row b of `ix` holds the context of a query at end - 1 (full: left-aligned positions 0..,
        ring: right-aligned ..end - 1); entries outside [lo, end) are padding."""
        L = ix.length
        rows = ix.rows.view(-1, L)[b].tolist() if L else []
        lo = 0 if kind == "full" else max(0, end - self.window)
        pos = range(L) if kind == "full" else range(end - L, end)
        got = [self.pool[kind][r] for r, p in zip(rows, pos, strict=True) if lo <= p < end]
        assert got == [(seq.seq_id, p) for p in range(lo, end)], (kind, seq, end)

    def check_and_write(self, batch):
        seqs, starts = batch.seqs, [s.num_computed for s in batch.seqs]
        ctx = StepContext.build(
            starts,
            batch.num_new,
            [s.full_blocks for s in seqs],
            [s.ring_blocks for s in seqs],
            self.bs,
            self.window,
            1,
            torch.device("cpu"),
        )
        num_decode = batch.num_new.count(1)
        i = num_decode
        for g in ctx.groups[1 if num_decode else 0 :]:  # prefill groups, in step order
            assert g.start == sum(batch.num_new[:i]) and g.num_tokens == sum(batch.num_new[i : i + g.batch])
            for b in range(g.batch):
                for kind, ix in (("full", g.full), ("ring", g.ring)):
                    self.expect(seqs[i + b], kind, ix, b, starts[i + b])
            i += g.batch
        assert i == len(seqs)
        positions = ctx.positions.tolist()
        owner = [s.seq_id for s, n in zip(seqs, batch.num_new, strict=True) for _ in range(n)]
        for r, row in enumerate(ctx.full_rows.tolist()):
            self.pool["full"][row] = (owner[r], positions[r])
        for r, row in zip(ctx.ring_src.tolist(), ctx.ring_rows.tolist(), strict=True):
            self.pool["ring"][row] = (owner[r], positions[r])
        for g in ctx.groups[: 1 if num_decode else 0]:
            for b in range(g.batch):
                for kind, ix in (("full", g.full), ("ring", g.ring)):
                    self.expect(seqs[b], kind, ix, b, starts[b] + 1)


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("shadow_kv", [False, True])
def test_random_load_keeps_invariants_and_leaks_nothing(shadow_kv, shared):
    rng = random.Random((1234 if shadow_kv else 4321) + shared)
    bs, window, max_model_len = 16, 128, 700
    num_requests = 200 if shadow_kv else 1000
    # shared: one pool for full and ring blocks, with the memory of the split pools' full one
    bm = BlockManager(num_full_blocks=max_model_len // bs + 6, block_size=bs, window=window, shared=shared)
    sched = Scheduler(bm, max_num_seqs=12, max_num_batched_tokens=256, watermark_blocks=2)
    shadow = KVShadow(bm, window) if shadow_kv else None
    seqs, pending = [], list(range(num_requests))
    preemptions = steps = 0
    while pending or len(sched):
        for _ in range(rng.randint(0, 3)):  # arrivals while others run
            if pending:
                i = pending.pop(0)
                seq = make_seq(
                    i, rng.randint(1, 300), rng.randint(1, 200), max_model_len, ignore_eos=rng.random() < 0.5
                )
                seqs.append(seq)
                sched.add(seq)
        if rng.random() < 0.05 and len(sched):  # abort a random unfinished request
            victim = rng.choice([*sched.running, *sched.waiting])
            sched.abort(victim)
        batch = sched.schedule()
        if not batch:
            continue
        steps += 1
        preemptions += len(batch.preempted)
        assert batch.num_tokens <= 256 and len(sched.running) <= 12
        assert [n == 1 for n in batch.num_new] == sorted([n == 1 for n in batch.num_new], reverse=True)
        for seq, n in zip(batch.seqs, batch.num_new, strict=True):
            assert seq.status is Status.RUNNING and 1 <= n <= seq.num_tokens - seq.num_computed
            assert len(seq.full_blocks) == cdiv(seq.num_computed + n, bs)
            assert len(seq.ring_blocks) == min(cdiv(seq.num_computed + n, bs), window // bs)
        bm.check_invariants(sched.running)
        if shadow:
            shadow.check_and_write(batch)
        sampled = [
            rng.choice(STOP) if rng.random() < 0.01 else rng.randrange(1000) for _ in range(sum(batch.sample))
        ]
        sched.postprocess(batch, sampled)
        bm.check_invariants(sched.running)

    assert preemptions > 0, "the cache was meant to be too small for the load"
    assert bm.full.num_free == bm.full.num_blocks and bm.ring.num_free == bm.ring.num_blocks
    reasons = {"stop": 0, "length": 0, "abort": 0}
    for seq in seqs:
        assert seq.is_finished and not seq.full_blocks and not seq.ring_blocks
        reasons[seq.finish_reason] += 1
        out = seq.output_ids
        if seq.finish_reason == "stop":
            assert not seq.params.ignore_eos and out[-1] in STOP and out[-1] == seq.stop_token_id
            assert not any(t in STOP for t in out[:-1])
        elif seq.finish_reason == "length":
            assert (
                len(seq)
                == seq.max_tokens
                == min(seq.num_prompt_tokens + seq.params.max_new_tokens, max_model_len)
            )
            assert seq.params.ignore_eos or not any(t in STOP for t in out)
    assert len(seqs) == num_requests and all(reasons.values()), reasons


def test_decode_continues_while_new_requests_prefill_in_chunks():
    bm = BlockManager(num_full_blocks=64, block_size=16, window=128)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=100)
    a = make_seq(0, 10, 50)
    sched.add(a)
    batch = sched.schedule()
    assert batch.seqs == [a] and batch.num_new == [10] and batch.sample == [True]
    sched.postprocess(batch, [5])
    b = make_seq(1, 250, 5)
    sched.add(b)
    # a decodes every step while b's 250-token prompt goes in chunks of what the budget leaves.
    chunks = []
    while b.num_computed < 250 or not chunks:
        batch = sched.schedule()
        assert batch.seqs[0] is a and batch.num_new[0] == 1 and batch.sample[0]
        chunks.append(batch.num_new[1])
        sched.postprocess(batch, [5] * sum(batch.sample))
    assert chunks == [99, 99, 52]
    assert b.num_output_tokens == 1 and a.num_output_tokens == 4


def test_preempts_newest_and_recomputes_it_later():
    bm = BlockManager(num_full_blocks=4, block_size=4, window=8)  # 16 positions in all
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64)
    # stop ids on (the sampled 3 is none of them): the final lengths are unknown to admission
    a, b = (make_seq(i, 6, 20, max_model_len=16) for i in range(2))
    sched.add(a)
    sched.add(b)
    preempted_at = []
    while len(sched):
        batch = sched.schedule()
        if batch.preempted:
            preempted_at.append((batch.preempted, a.num_tokens, b.num_tokens))
        sched.postprocess(batch, [3] * sum(batch.sample))
        bm.check_invariants(sched.running)
    # Both prompts fit (2 + 2 blocks); a's third block takes b's: b is recomputed after a ends.
    assert preempted_at == [([b], 9, 9)]  # feeding position 8 needs a third block
    assert b.num_preemptions == 1
    assert (a.finish_reason, len(a), b.finish_reason, len(b)) == ("length", 16, "length", 16)


def test_known_final_lengths_are_reserved_so_nothing_is_preempted():
    """The same two requests ignoring EOS (final length 16 = the whole cache): b waits for a's end
    instead of being admitted, preempted and recomputed; meanwhile can_admit_next says no."""
    bm = BlockManager(num_full_blocks=4, block_size=4, window=8)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64)
    a, b = (make_seq(i, 6, 20, max_model_len=16, ignore_eos=True) for i in range(2))
    sched.add(a)
    sched.add(b)
    admitted_b_at = None
    steps = 0
    while len(sched):
        batch = sched.schedule()
        assert not batch.preempted
        if b in batch.seqs and admitted_b_at is None:
            admitted_b_at = (steps, a.finish_reason)
        if a.status is Status.RUNNING and b.status is Status.WAITING:
            assert not sched.can_admit_next()
        sched.postprocess(batch, [3] * sum(batch.sample))
        bm.check_invariants(sched.running)
        steps += 1
    assert admitted_b_at == (10, "length")  # a: its prefill step (token 7) + 9 decodes to 16 tokens
    assert sched.num_preemptions == 0
    assert (len(a), len(b)) == (16, 16)


def test_known_lengths_admit_together_when_they_fit():
    """Room for both final lengths (2 x 3 blocks of 8): both join in the first step."""
    bm = BlockManager(num_full_blocks=8, block_size=4, window=8)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64)
    seqs = [make_seq(i, 6, 6, max_model_len=16, ignore_eos=True) for i in range(3)]
    for s in seqs:
        sched.add(s)
    batch = sched.schedule()
    assert batch.seqs == seqs[:2]  # the third's 3 blocks would eat into the first two's growth
    assert not sched.can_admit_next()


def test_a_sequence_larger_than_the_whole_cache_fails_loudly():
    bm = BlockManager(num_full_blocks=2, block_size=4, window=8)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64)
    sched.add(make_seq(0, 12, 4))
    with pytest.raises(RuntimeError, match=r"KV cache \(8 tokens\) cannot hold 12 positions"):
        sched.schedule()


def test_a_known_length_larger_than_the_whole_cache_names_its_final_length():
    bm = BlockManager(num_full_blocks=2, block_size=4, window=8)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64)
    sched.add(make_seq(0, 6, 4, ignore_eos=True))  # 6 prompt positions fit; its final 10 do not
    with pytest.raises(RuntimeError, match=r"KV cache \(8 tokens\) cannot hold 10 positions"):
        sched.schedule()

"""Continuous batching: each step mixes running decodes, prefill chunks and newly admitted requests.

A step feeds every running sequence the tokens it has not computed yet (one for a decode,
a chunk for a long prompt), oldest first, within `max_num_batched_tokens`; what budget is left
admits waiting requests, at most `max_num_seqs` running. When the KV cache cannot grow, the
newest running sequence is preempted: its blocks are freed and it is recomputed later from its
tokens (prompt + output so far), so the oldest request always makes progress.

A request that ignores EOS has a known final length (Sequence.max_tokens), and admitting it when
the cache cannot hold that would only buy a preemption later, whose recompute is pure waste
(gpt-oss-120b, 2000 x (1024 -> 1278) on an H200: 480k of 2.5M prefill tokens were recomputes).
So admission keeps the blocks such running sequences will still grow into (`_growth`) out of
reach, and admits one of them only if its whole final length fits too. Other requests are
admitted on their next chunk, as before, but never into that reserve. GPTOSS_RESERVE_KNOWN=0 turns
it off (A/B timing: bench/gptoss_gpu.py --trace), with the engine's multi-step rule it goes with.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass, field

from gptoss.block_manager import BlockManager
from gptoss.sequence import Sequence, Status

RESERVE_KNOWN = os.environ.get("GPTOSS_RESERVE_KNOWN", "1") != "0"


@dataclass(slots=True)
class Batch:
    """One step's work: seqs[i] feeds positions [num_computed, num_computed + num_new[i])."""

    seqs: list[Sequence] = field(default_factory=list)
    num_new: list[int] = field(default_factory=list)
    sample: list[bool] = field(default_factory=list)  # the step ends this seq's pending tokens
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new)

    def __bool__(self) -> bool:
        return bool(self.seqs)


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        watermark_blocks: int = 0,
    ) -> None:
        self.bm = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        # Blocks kept free when admitting, so running sequences can decode a while before
        # anything has to be preempted (admit-then-preempt thrashes).
        self.watermark_blocks = watermark_blocks
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # oldest first
        self.num_preemptions = 0  # over the scheduler's life, for stats and tests

    def __len__(self) -> int:
        return len(self.waiting) + len(self.running)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def abort(self, seq: Sequence) -> None:
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
            self.bm.free(seq)
        elif seq.status is Status.WAITING:
            self.waiting.remove(seq)
        seq.finish("abort")

    def abort_all(self, reason: str = "abort") -> list[Sequence]:
        """Drop every request (used when a step failed and the cache can no longer be trusted)."""
        seqs = [*self.running, *self.waiting]
        for seq in self.running:
            self.bm.free(seq)
        self.running.clear()
        self.waiting.clear()
        for seq in seqs:
            seq.finish(reason)
        return seqs

    def schedule(self) -> Batch:
        batch = Batch()
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_tokens - seq.num_computed, budget)
            if self._grow(seq, n, batch):
                budget -= n
                i += 1
            # else seq itself was preempted, and every newer one before it: the loop ends.
        if not batch.preempted:
            budget = self._admit(batch, budget)
        # Decodes first: they attend as one batch, prefill chunks in groups after them.
        order = sorted(range(len(batch.seqs)), key=lambda j: batch.num_new[j] != 1)
        batch.seqs = [batch.seqs[j] for j in order]
        batch.num_new = [batch.num_new[j] for j in order]
        batch.sample = [
            s.num_computed + n == s.num_tokens for s, n in zip(batch.seqs, batch.num_new, strict=True)
        ]
        return batch

    def _grow(self, seq: Sequence, n: int, batch: Batch) -> bool:
        while not self.bm.can_allocate(seq, seq.num_computed + n):
            victim = self.running.pop()
            self._preempt(victim)
            batch.preempted.append(victim)
            if victim is seq:
                if not self.running:  # alone and still too big: waiting would spin forever
                    raise RuntimeError(
                        f"the KV cache ({self.bm.max_tokens_per_seq()} tokens) cannot "
                        f"hold {seq.num_computed + n} positions of {seq!r}"
                    )
                return False
        self.bm.allocate(seq, seq.num_computed + n)
        batch.seqs.append(seq)
        batch.num_new.append(n)
        return True

    def _final_blocks(self, seq: Sequence) -> int:
        """Blocks (full pool, or shared pool) a known-length sequence will hold at its end (0: its
        length is unknown)."""
        return self.bm.blocks_at(seq.max_tokens) if RESERVE_KNOWN and seq.params.ignore_eos else 0

    def _growth(self) -> int:
        """Blocks the running known-length sequences will still take."""
        return sum(max(0, self._final_blocks(s) - self.bm.held(s)) for s in self.running)

    def _fits(self, seq: Sequence, n: int, growth: int) -> bool:
        """Whether admitting `seq` with an n-token first chunk keeps `growth` blocks and the
        watermark free (a known-length `seq`: its whole final length, so it never preempts)."""
        reserve = (self.watermark_blocks if self.running else 0) + growth
        extra = max(0, self._final_blocks(seq) - self.bm.blocks_at(n))
        return self.bm.can_allocate(seq, n, reserve + extra)

    def can_admit_next(self) -> bool:
        """Whether the next waiting request could join now (engine: no multi-step if it could)."""
        if not self.waiting or len(self.running) >= self.max_num_seqs:
            return False
        if not RESERVE_KNOWN:  # the rule before: any waiting request blocks multi-step
            return True
        seq = self.waiting[0]
        return self._fits(seq, min(seq.num_tokens, self.max_num_batched_tokens), self._growth())

    def _admit(self, batch: Batch, budget: int) -> int:
        growth = self._growth()
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            n = min(seq.num_tokens, budget)
            if not self._fits(seq, n, growth):
                if not self.running:  # the whole cache is free and still too small
                    need = max(n, seq.max_tokens if self._final_blocks(seq) else 0)
                    raise RuntimeError(
                        f"the KV cache ({self.bm.max_tokens_per_seq()} tokens) cannot "
                        f"hold {need} positions of {seq!r}"
                    )
                break
            growth += max(0, self._final_blocks(seq) - self.bm.blocks_at(n))
            self.waiting.popleft()
            self.bm.allocate(seq, n)
            seq.status = Status.RUNNING
            self.running.append(seq)
            batch.seqs.append(seq)
            batch.num_new.append(n)
            budget -= n
        return budget

    def _preempt(self, seq: Sequence) -> None:
        self.bm.free(seq)
        seq.num_computed = 0
        seq.status = Status.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def extend_decode(self, batch: Batch, k: int) -> bool:
        """Allocate blocks for k decode positions per sequence of a pure decode batch (multi-step),
        if the cache has them without preempting anyone; False leaves everything as it was."""
        need = [self.bm.blocks_needed(s, s.num_computed + k) for s in batch.seqs]
        if not self.bm.can_take(sum(f for f, _ in need), sum(r for _, r in need)):
            return False
        for s in batch.seqs:
            self.bm.allocate(s, s.num_computed + k)
        return True

    def postprocess_multi(self, seqs: list[Sequence], tokens: list[list[int]]) -> list[tuple[Sequence, int]]:
        """Record a multi-step decode: each seq takes its ids in order until it finishes; the rest
        were computed past its end and are dropped. Returns (seq, ids taken) for every seq."""
        out: list[tuple[Sequence, int]] = []
        finished = False
        for seq, ids in zip(seqs, tokens, strict=True):
            taken = 0
            for t in ids:
                seq.num_computed += 1
                seq.append(t)
                taken += 1
                if seq.is_finished:
                    self.bm.free(seq)
                    finished = True
                    break
            out.append((seq, taken))
        if finished:
            self.running = [s for s in self.running if not s.is_finished]
        return out

    def postprocess(self, batch: Batch, sampled: list[int]) -> list[Sequence]:
        """Record a step's progress; `sampled` holds one id per seq with batch.sample set.

        Returns the seqs that got a token (finished ones included, their blocks freed).
        """
        if len(sampled) != sum(batch.sample):
            raise RuntimeError(f"{len(sampled)} sampled tokens for {sum(batch.sample)} sequences")
        out: list[Sequence] = []
        it = iter(sampled)
        finished = False
        for seq, n, sample in zip(batch.seqs, batch.num_new, batch.sample, strict=True):
            seq.num_computed += n
            if not sample:
                continue
            seq.append(next(it))
            out.append(seq)
            if seq.is_finished:
                self.bm.free(seq)
                finished = True
        if finished:
            self.running = [s for s in self.running if not s.is_finished]
        return out

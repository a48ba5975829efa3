"""Who owns which KV-cache block: full layers grow a block table, sliding layers reuse a small ring.

Full-attention layers keep every position, so a sequence of n tokens holds ceil(n / bs) blocks
of the full pool. Sliding-window layers only ever read the last `window` positions, so a
sequence holds at most R = ceil(window / bs) blocks of the ring pool and position p lives in
ring[(p // bs) % R]; attention reads a step's context from the ring before the step writes.

With as many sliding layers as full ones (gpt-oss alternates them) the two kinds can share one pool
(`shared`): cache tensor j holds full layer j's and sliding layer j's K/V, and a block id belongs to
one kind at a time, so memory goes where the step's sequences need it. Split pools had to size the
rings for max_num_seqs sequences up front: 4.8 GB of an 80 GB card for gpt-oss-120b at 1024
sequences, while its full layers had room for ~104 sequences of 2,302 tokens.
"""

from __future__ import annotations

from collections import deque

from gptoss.sequence import Sequence


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def longest_seq_blocks(num_blocks: int, ring_len: int, shared: bool) -> int:
    """Full-layer blocks of the longest sequence a pool of num_blocks holds alone: in a shared pool
    its ring (up to ring_len blocks) comes out of the same blocks."""
    if not shared:
        return num_blocks
    return num_blocks - ring_len if num_blocks >= 2 * ring_len else num_blocks // 2


class BlockPool:
    """A free list of block ids; raises instead of handing out a block twice."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    def take(self, n: int) -> list[int]:
        if n > len(self._free):
            raise RuntimeError(f"asked for {n} KV blocks with only {len(self._free)} free")
        ids = [self._free.popleft() for _ in range(n)]
        self._used.update(ids)
        return ids

    def give_back(self, ids: list[int]) -> None:
        for i in ids:
            self._used.remove(i)  # KeyError here means a double free: a bug, so let it raise
        self._free.extend(ids)


class BlockManager:
    def __init__(
        self,
        num_full_blocks: int,
        block_size: int,
        window: int | None,
        num_ring_blocks: int | None = None,
        *,
        shared: bool = False,
    ) -> None:
        """`window` None means the model has no sliding layers and rings are not kept.

        The ring pool defaults to the size of the full pool: a sequence never holds more ring
        blocks than full blocks, so if the full pool can grant a request, so can the ring pool.
        shared: one pool of num_full_blocks serves both kinds (num_ring_blocks is then ignored).
        """
        self.block_size = block_size
        self.ring_len = cdiv(window, block_size) if window else 0
        self.shared = shared and self.ring_len > 0
        self.full = BlockPool(num_full_blocks)
        if self.shared:
            self.ring = self.full
        else:
            self.ring = BlockPool(num_full_blocks if num_ring_blocks is None else num_ring_blocks)

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> tuple[int, int]:
        """Extra (full, ring) blocks `seq` needs to hold positions [0, num_tokens)."""
        n = cdiv(num_tokens, self.block_size)
        return max(0, n - len(seq.full_blocks)), max(0, min(n, self.ring_len) - len(seq.ring_blocks))

    def can_take(self, full: int, ring: int, reserve: int = 0) -> bool:
        """Whether the pools have `full` and `ring` blocks free with `reserve` more left over."""
        if self.shared:
            return full + ring + reserve <= self.full.num_free
        return full + reserve <= self.full.num_free and ring <= self.ring.num_free

    def can_allocate(self, seq: Sequence, num_tokens: int, reserve: int = 0) -> bool:
        """Whether `seq` can grow to `num_tokens` positions and still leave `reserve` blocks (of the
        full pool, or of the shared one) free."""
        return self.can_take(*self.blocks_needed(seq, num_tokens), reserve)

    def blocks_at(self, num_tokens: int) -> int:
        """Blocks of the full (or shared) pool a sequence holds at `num_tokens` positions: what a
        known-length sequence's reservation counts."""
        n = cdiv(num_tokens, self.block_size)
        return n + min(n, self.ring_len) if self.shared else n

    def held(self, seq: Sequence) -> int:
        """Blocks of the full (or shared) pool `seq` holds now."""
        return len(seq.full_blocks) + (len(seq.ring_blocks) if self.shared else 0)

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        if not self.can_allocate(seq, num_tokens):
            raise RuntimeError(f"KV cache cannot hold {num_tokens} positions for {seq!r}")
        full, ring = self.blocks_needed(seq, num_tokens)
        seq.full_blocks += self.full.take(full)
        seq.ring_blocks += self.ring.take(ring)

    def free(self, seq: Sequence) -> None:
        self.full.give_back(seq.full_blocks)
        self.ring.give_back(seq.ring_blocks)
        seq.full_blocks = []
        seq.ring_blocks = []

    def max_seqs_of(self, num_tokens: int) -> int:
        """How many sequences of `num_tokens` positions the cache holds at once (vLLM prints the same
        as its "maximum concurrency"): below max_num_seqs, the KV cache bounds the batch."""
        if self.shared:
            return self.full.num_blocks // self.blocks_at(num_tokens)
        n = cdiv(num_tokens, self.block_size)
        rings = self.ring.num_blocks // min(n, self.ring_len) if self.ring_len else self.full.num_blocks
        return min(self.full.num_blocks // n, rings)

    def max_tokens_per_seq(self) -> int:
        """The longest sequence the cache can hold on its own."""
        return longest_seq_blocks(self.full.num_blocks, self.ring_len, self.shared) * self.block_size

    def check_invariants(self, seqs: list[Sequence]) -> None:
        """Every used block belongs to exactly one sequence; the free lists hold the rest (tests)."""
        groups = (
            [(self.full, ("full_blocks", "ring_blocks"))]
            if self.shared
            else [
                (self.full, ("full_blocks",)),
                (self.ring, ("ring_blocks",)),
            ]
        )
        for pool, attrs in groups:
            owned = [b for s in seqs for attr in attrs for b in getattr(s, attr)]
            assert len(owned) == len(set(owned)), f"a block of {attrs} is owned twice"
            assert set(owned) == pool._used, f"{attrs}: owned {len(owned)} != used {len(pool._used)}"
            assert len(pool._free) + len(pool._used) == pool.num_blocks
            assert not (set(pool._free) & pool._used)

"""Who owns which KV-cache block: full layers grow a block table, sliding layers reuse a small ring.

Full-attention layers keep every position, so a sequence of n tokens holds ceil(n / bs) blocks
of the full pool. Sliding-window layers only ever read the last `window` positions, so a
sequence holds at most R = ceil(window / bs) blocks of the ring pool and position p lives in
ring[(p // bs) % R]; attention reads a step's context from the ring before the step writes.
"""

from __future__ import annotations

from collections import deque

from gptoss.sequence import Sequence


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


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
        self, num_full_blocks: int, block_size: int, window: int | None, num_ring_blocks: int | None = None
    ) -> None:
        """`window` None means the model has no sliding layers and rings are not kept.

        The ring pool defaults to the size of the full pool: a sequence never holds more ring
        blocks than full blocks, so if the full pool can grant a request, so can the ring pool.
        """
        self.block_size = block_size
        self.ring_len = cdiv(window, block_size) if window else 0
        self.full = BlockPool(num_full_blocks)
        self.ring = BlockPool(num_full_blocks if num_ring_blocks is None else num_ring_blocks)

    def _need(self, seq: Sequence, num_tokens: int) -> tuple[int, int]:
        """Extra (full, ring) blocks `seq` needs to hold positions [0, num_tokens)."""
        n = cdiv(num_tokens, self.block_size)
        return max(0, n - len(seq.full_blocks)), max(0, min(n, self.ring_len) - len(seq.ring_blocks))

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> tuple[int, int]:
        """Extra (full, ring) blocks `seq` needs to hold positions [0, num_tokens)."""
        return self._need(seq, num_tokens)

    def can_allocate(self, seq: Sequence, num_tokens: int, reserve: int = 0) -> bool:
        """Whether `seq` can grow to `num_tokens` positions and still leave `reserve` full blocks free."""
        full, ring = self._need(seq, num_tokens)
        return full + reserve <= self.full.num_free and ring <= self.ring.num_free

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        full, ring = self._need(seq, num_tokens)
        if full > self.full.num_free or ring > self.ring.num_free:
            raise RuntimeError(f"KV cache cannot hold {num_tokens} positions for {seq!r}")
        seq.full_blocks += self.full.take(full)
        seq.ring_blocks += self.ring.take(ring)

    def free(self, seq: Sequence) -> None:
        self.full.give_back(seq.full_blocks)
        self.ring.give_back(seq.ring_blocks)
        seq.full_blocks = []
        seq.ring_blocks = []

    def max_tokens_per_seq(self) -> int:
        """The longest sequence the cache can hold on its own."""
        return self.full.num_blocks * self.block_size

    def check_invariants(self, seqs: list[Sequence]) -> None:
        """Every used block belongs to exactly one sequence; the free lists hold the rest (tests)."""
        for pool, attr in ((self.full, "full_blocks"), (self.ring, "ring_blocks")):
            owned = [b for s in seqs for b in getattr(s, attr)]
            assert len(owned) == len(set(owned)), f"a {attr} block is shared"
            assert set(owned) == pool._used, f"{attr}: owned {len(owned)} != used {len(pool._used)}"
            assert len(pool._free) + len(pool._used) == pool.num_blocks
            assert not (set(pool._free) & pool._used)

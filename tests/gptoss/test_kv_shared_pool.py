"""One KV pool for full and sliding layers (gptoss.block_manager shared=True): what fits, what a
known-length reservation counts, and what it buys gpt-oss-120b on an 80 GB card (model_runner.kv_blocks)."""

from __future__ import annotations

import pytest

from gptoss.block_manager import BlockManager
from gptoss.config import PRESETS
from gptoss.model_runner import KvGeometry, kv_blocks
from gptoss.scheduler import Scheduler
from tests.gptoss.test_scheduler import make_seq


def test_a_long_sequence_takes_blocks_that_split_pools_kept_for_rings():
    # bs 4, window 8: a ring of 2 blocks. 32 positions need 8 full + 2 ring blocks.
    shared = BlockManager(num_full_blocks=10, block_size=4, window=8, shared=True)
    split = BlockManager(num_full_blocks=5, block_size=4, window=8, num_ring_blocks=5)  # same memory
    seq = make_seq(0, 32, 1)
    assert not split.can_allocate(seq, 32)
    assert shared.can_allocate(seq, 32) and not shared.can_allocate(seq, 33)
    shared.allocate(seq, 32)
    assert (len(seq.full_blocks), len(seq.ring_blocks), shared.full.num_free) == (8, 2, 0)
    assert not set(seq.full_blocks) & set(seq.ring_blocks)  # one id, one kind
    shared.check_invariants([seq])
    shared.free(seq)
    assert shared.full.num_free == 10 and shared.ring is shared.full
    assert (shared.max_tokens_per_seq(), split.max_tokens_per_seq()) == (32, 20)
    # sequences of 8 positions (2 full + 2 ring blocks): shared 10 // 4, split min(5 // 2, 5 // 2)
    assert (shared.max_seqs_of(8), split.max_seqs_of(8)) == (2, 2)
    # of 4 positions (1 + 1): shared 10 // 2; split min(5, 5)
    assert (shared.max_seqs_of(4), split.max_seqs_of(4)) == (5, 5)
    assert BlockManager(num_full_blocks=6, block_size=4, window=None).max_seqs_of(9) == 2


def test_the_longest_sequence_of_a_pool_smaller_than_two_rings():
    bm = BlockManager(num_full_blocks=3, block_size=4, window=8, shared=True)  # 3 < 2 x 2
    assert bm.max_tokens_per_seq() == 4  # 1 full + 1 ring block
    seq = make_seq(0, 4, 1)
    assert bm.can_allocate(seq, 4) and not bm.can_allocate(seq, 5)


def test_a_model_without_sliding_layers_keeps_one_plain_pool():
    bm = BlockManager(num_full_blocks=6, block_size=4, window=None, shared=True)
    assert not bm.shared and bm.max_tokens_per_seq() == 24


def test_known_length_reservations_count_the_ring_in_a_shared_pool():
    """Final length 16 = 4 full + 2 ring blocks each: a pool of 10 holds one such sequence, not two,
    so b waits for a instead of being admitted and preempted; 12 blocks hold both at once."""
    for blocks, together in ((10, False), (12, True)):
        bm = BlockManager(num_full_blocks=blocks, block_size=4, window=8, shared=True)
        sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64)
        a, b = (make_seq(i, 6, 10, max_model_len=16, ignore_eos=True) for i in range(2))
        sched.add(a)
        sched.add(b)
        assert sched.schedule().seqs == ([a, b] if together else [a])
        assert bm.blocks_at(16) == 6 and bm.held(a) == 2 + 2  # 6 prompt positions: 2 full + 2 ring
        while len(sched):
            batch = sched.schedule()
            assert not batch.preempted
            sched.postprocess(batch, [3] * sum(batch.sample))
            bm.check_invariants(sched.running)
        assert sched.num_preemptions == 0 and (len(a), len(b)) == (16, 16)


def _geometry(preset: str) -> KvGeometry:
    cfg = PRESETS[preset]
    kinds = [cfg.window(i) is None for i in range(cfg.num_hidden_layers)]
    per_slot = 2 * cfg.num_key_value_heads * cfg.head_dim * 2  # bf16 K and V of one layer
    return KvGeometry(sum(kinds), len(kinds) - sum(kinds), per_slot, 16, cfg.sliding_window // 16)


def test_shared_pool_runs_half_again_as_many_mlperf_sequences_of_120b_on_an_80gb_card():
    """The budget our replica had on an H100 80GB (v16: 239,728 full-layer tokens beside rings for
    1024 sequences). MLPerf's 1024 + 1278 = 2,302 tokens: 144 full blocks (+ 8 ring) a sequence."""
    g = _geometry("120b")
    assert (g.n_full, g.n_ring, g.per_slot, g.ring_len, g.shared) == (18, 18, 2048, 8, True)
    budget = 13_670_000_000
    # Split pools (before): rings for 1024 sequences first, the full layers' tokens from the rest.
    rings = 18 * 1024 * 8 * 16 * 2048
    split_tokens = (budget - rings) // (18 * 2048)
    assert rings == 4_831_838_208 and split_tokens // 16 // 144 == 104
    shared_blocks = kv_blocks(g, budget, None, 1024, 4096)
    assert shared_blocks == budget // (18 * 16 * 2048) == 23_176
    assert shared_blocks // (144 + 8) == 152


def test_unequal_layer_kinds_keep_split_pools():
    g = KvGeometry(3, 1, 2048, 16, 8)
    assert not g.shared
    # rings for 4 sequences (1 layer x 4 x 8 blocks x 16 x 2048 bytes) come off the budget first
    assert kv_blocks(g, 10 * 2**20, None, 4, 4096) == (10 * 2**20 - 4 * 8 * 16 * 2048) // (3 * 2048) // 16


@pytest.mark.parametrize("tokens", [512, 400])
def test_kv_cache_tokens_is_the_shared_pools_slots(tokens):
    assert kv_blocks(_geometry("tiny"), 0, tokens, 8, 4096) == tokens // 16

"""The start-up warm-up (gptoss.warmup): which requests it runs, which kinds of step they reach, and
that the engine afterwards behaves exactly as a fresh one."""

from __future__ import annotations

from gptoss.engine import EngineConfig, LLMEngine
from gptoss.kernel_warm import warm_sizes
from gptoss.kernels.attention import decode_group_sizes
from gptoss.sampling import SamplingParams
from gptoss.warmup import GREEDY, LONG, SAMPLED, SAMPLED_P, SAMPLED_T1, round_sizes, warm_up, warmup_prompts
from tests.gptoss.test_engine import make_engine, prompts_of


def test_prompts_fill_more_than_one_budget_with_short_ones_first():
    reqs = warmup_prompts(budget=64, max_model_len=128, max_num_seqs=8, vocab_size=1000)
    # 7 short ones (67 tokens), then one long one: 67 + 101 > 64 + 37
    assert [len(p) for p, _ in reqs] == [17, 33, 5, 3, 3, 3, 3, 101]
    assert [p for _, p in reqs] == [GREEDY, SAMPLED, SAMPLED_P, SAMPLED_T1, *[GREEDY] * 3, LONG]
    assert SAMPLED.top_k == 20 and SAMPLED_P.top_k == 0 and SAMPLED_P.top_p == 0.9  # both filters
    # and the unfiltered draw, its second token in a step of its own (no filtered row beside it)
    assert (SAMPLED_T1.temperature, SAMPLED_T1.top_k, SAMPLED_T1.top_p, SAMPLED_T1.max_new_tokens) == (
        1,
        0,
        1,
        2,
    )
    assert all(0 <= t < 1000 for p, _ in reqs for t in p)
    # a short context: the long prompts are max_model_len - 9 long, as many as the budget needs
    reqs = warmup_prompts(budget=64, max_model_len=40, max_num_seqs=4, vocab_size=1000)
    assert [len(p) for p, _ in reqs] == [17, 33, 5, 31]
    reqs = warmup_prompts(budget=250, max_model_len=40, max_num_seqs=80, vocab_size=1000)
    assert len(reqs) == 64 + 2 and sum(len(p) for p, _ in reqs) == 238 + 2 * 31  # 64 short ones at most
    assert [len(p) for p, _ in warmup_prompts(64, 128, max_num_seqs=1, vocab_size=1000)] == [101]
    # the same ids every time: a warm-up is reproducible
    assert warmup_prompts(64, 128, 8, 1000) == warmup_prompts(64, 128, 8, 1000)


def test_tiny_contexts_still_give_valid_prompts():
    reqs = warmup_prompts(budget=16, max_model_len=4, max_num_seqs=8, vocab_size=50)
    assert {len(p) for p, _ in reqs} == {1}  # every prompt below max_model_len


def test_warm_up_reaches_full_odd_and_mixed_steps(tiny_checkpoint):
    eng = make_engine(tiny_checkpoint, warm_kernels=False)
    assert round_sizes(eng) == []  # the torch kernels compile nothing
    stats = warm_up(eng, sizes=[1, 2, 4])
    assert stats.step_tokens[0] == 128  # the whole budget in the first step
    # the two filtered requests end at their prefill; the 5 others (the unfiltered one among them, for
    # its second token) decode beside the long prompt's rest
    assert stats.step_tokens[1] == 5 + (67 + 165 - 128)
    # then S = 1, 2 and 4 decodes beside a 37-token prefill
    assert stats.mixed_decodes == (5, 1, 2, 4)
    assert [n for n in stats.step_tokens if n in (1 + 37, 2 + 37, 4 + 37)] == [38, 39, 41]
    assert stats.burst_rows == ()  # bursts need CUDA graphs
    assert stats.seconds > 0


def test_decode_group_sizes_reach_each_split_specialization_once():
    # 20b / 120b on 132 SMs: 8 KV heads, full layers bounded by 8192 keys, sliding ones by 128 (one
    # split at every S). Full layers: min(cdiv(528, 8 S), cdiv(8192, 128 if S <= 8 else 256), 64)
    # splits: 64 at S 1 (a multiple of 16), 33 at 2 (padded to 64), 22 at 3 (32), 14 at 5 (16),
    # 8 at 9 (the large launch), 4 at 17, 2 at 33, 1 at 66; sizes between repeat one of these.
    sizes = decode_group_sizes(1023, 8, (128, 8192), 132)
    assert sizes == [1, 2, 3, 5, 9, 17, 33, 66]
    assert decode_group_sizes(1023, 8, (128, 8192), 132) == sizes  # the same every time
    assert decode_group_sizes(4, 8, (128, 8192), 132) == [1, 2, 3]
    assert decode_group_sizes(1023, 8, (128,), 132) == [1, 9]  # sliding only: small or not


def test_engine_after_warm_up_is_a_fresh_engine(tiny_checkpoint):
    """Sampled requests without a seed draw from their number: a warm-up that left the numbering
    moved would change them. Every block must be free again and no request left."""
    prompts = prompts_of([9, 20, 14])
    params = [SamplingParams(max_new_tokens=6, temperature=1.0, ignore_eos=True), GREEDY, SAMPLED]
    fresh = make_engine(tiny_checkpoint, warm_kernels=False)
    free = fresh.scheduler.bm.full.num_free
    want = fresh.generate(prompts, params)
    eng = make_engine(tiny_checkpoint, warm_kernels=False)
    warm_up(eng)
    assert eng.seqs == {} and len(eng.scheduler) == 0
    assert eng.scheduler.bm.full.num_free == free
    assert eng.scheduler.num_preemptions == 0
    assert eng.generate(prompts, params) == want


def test_moe_warm_sizes_cover_each_bucket_round_and_not():
    assert warm_sizes(16384)[:4] == [31, 32, 63, 64]
    assert warm_sizes(16384)[-2:] == [16383, 16384] and len(warm_sizes(16384)) == 20
    assert warm_sizes(100) == [31, 32, 63, 64, 100]
    assert warm_sizes(10) == [10]


def test_engine_runs_it_only_with_the_triton_kernels_on_cuda(tiny_checkpoint):
    eng = LLMEngine(EngineConfig(tiny_checkpoint, device="cpu", dtype="float32", kv_cache_tokens=2048))
    assert eng.config.warm_kernels and eng.warmup is None and eng.info()["warmup"] is None

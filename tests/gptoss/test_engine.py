"""The engine on the real tiny checkpoint: paged greedy == reference model, batching invariance,
preemption, seeded sampling, stop/length rules."""

from __future__ import annotations

import random

import pytest
import torch

from gptoss.attention_ref import DenseAttention
from gptoss.engine import EngineConfig, LLMEngine
from gptoss.sampling import SamplingParams

GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)


def prompts_of(lengths, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(199000) for _ in range(n)] for n in lengths]


def make_engine(path, **kw):
    kw = {"dtype": "float32", "max_num_seqs": 8, "max_num_batched_tokens": 128, "kv_cache_tokens": 4096} | kw
    return LLMEngine(EngineConfig(path, **kw))


@pytest.fixture(scope="session")
def engine(tiny_checkpoint):
    return make_engine(tiny_checkpoint)


def reference_greedy(model, prompt, n):
    """Full forward over the whole sequence at every step, dense attention: no cache reuse at all."""
    ids = list(prompt)
    for _ in range(n):
        hidden = model(torch.tensor(ids), torch.arange(len(ids)), DenseAttention())
        ids.append(int(model.compute_logits(hidden[-1:]).argmax(-1)))
    return ids[len(prompt) :]


def alone(engine, prompt, params):
    return engine.generate([prompt], params)[0]


def test_paged_greedy_equals_reference_full_forward(engine, ref_fp32):
    # 1 token; chunked prefill (300 > 128 budget); decode crossing the 128 window (120 + 12).
    prompts = prompts_of([1, 17, 120, 300])
    outs = engine.generate(prompts, GREEDY)
    for prompt, out in zip(prompts, outs, strict=True):
        assert out == reference_greedy(ref_fp32, prompt, GREEDY.max_new_tokens)
    assert engine.scheduler.bm.full.num_free == engine.scheduler.bm.full.num_blocks


def test_batch_outputs_equal_each_request_alone(engine):
    lengths = [3, 130, 64, 250, 127, 9, 200, 40, 1, 90]  # > max_num_seqs: some wait for a slot
    prompts = prompts_of(lengths, seed=1)
    params = [
        SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True)
        for n in (20, 5, 70, 3, 10, 40, 8, 16, 30, 2)
    ]  # 64 + 70 crosses 128 while decoding
    batched = engine.generate(prompts, params)
    assert [len(o) for o in batched] == [p.max_new_tokens for p in params]
    for prompt, p, out in zip(prompts, params, batched, strict=True):
        assert out == alone(engine, prompt, p)


def test_cache_pressure_preempts_and_recomputes_without_changing_outputs(tiny_checkpoint, engine):
    small = make_engine(tiny_checkpoint, kv_cache_tokens=400, max_num_batched_tokens=512)
    prompts = prompts_of([100, 90, 80, 70], seed=2)
    # no stop ids, but EOS not ignored: the final lengths are unknown to admission, so it overcommits
    params = SamplingParams(max_new_tokens=40, temperature=0.0, stop_token_ids=())
    outs = small.generate(prompts, params)
    assert small.scheduler.num_preemptions > 0
    assert outs == [alone(engine, p, params) for p in prompts]
    bm = small.scheduler.bm
    assert (bm.full.num_free, bm.ring.num_free) == (bm.full.num_blocks, bm.ring.num_blocks)


def test_known_lengths_under_cache_pressure_wait_instead_of_preempting(tiny_checkpoint, engine):
    """The same prompts ignoring EOS: admission reserves each one's final length, so none is
    preempted (no recompute) and the outputs are the same as alone."""
    small = make_engine(tiny_checkpoint, kv_cache_tokens=400, max_num_batched_tokens=512)
    prompts = prompts_of([100, 90, 80, 70], seed=2)
    params = SamplingParams(max_new_tokens=40, temperature=0.0, ignore_eos=True)
    outs = small.generate(prompts, params)
    assert small.scheduler.num_preemptions == 0
    assert outs == [alone(engine, p, params) for p in prompts]
    assert list(map(len, outs)) == [40] * 4


def test_seeded_sampling_is_reproducible_and_batch_independent(engine):
    prompt = prompts_of([33], seed=3)[0]
    others = prompts_of([5, 200, 60], seed=4)

    def sampled(seed, **kw):
        return SamplingParams(max_new_tokens=16, temperature=1.0, seed=seed, ignore_eos=True, **kw)

    a = alone(engine, prompt, sampled(7))
    assert alone(engine, prompt, sampled(7)) == a
    # The same seed in a different batch draws the same samples.
    mixed = engine.generate([*others, prompt], [sampled(1), sampled(2), sampled(3), sampled(7)])
    assert mixed[-1] == a
    assert alone(engine, prompt, sampled(8)) != a
    greedy = alone(engine, prompt, SamplingParams(max_new_tokens=16, temperature=0.0, ignore_eos=True))
    assert a != greedy
    # top-k 1 is greedy whatever the seed; top-k/top-p runs are reproducible too.
    assert alone(engine, prompt, sampled(9, top_k=1)) == greedy
    b = alone(engine, prompt, sampled(5, top_k=20, top_p=0.9))
    assert b == alone(engine, prompt, sampled(5, top_k=20, top_p=0.9))


def test_stop_tokens_end_the_request_unless_ignore_eos(engine):
    prompt = prompts_of([21], seed=5)[0]
    free = alone(engine, prompt, GREEDY)
    stop_id = free[4]
    first = free.index(stop_id)
    engine.add("stop", prompt, SamplingParams(max_new_tokens=12, temperature=0.0, stop_token_ids=(stop_id,)))
    deltas = []
    while engine.has_work():
        deltas += [d for rid, d in engine.step() if rid == "stop"]
    assert [t for d in deltas for t in d.token_ids] == free[: first + 1]  # the stop id is included
    assert [d.finish_reason for d in deltas] == [None] * first + ["stop"]
    assert deltas[-1].stop_token_id == stop_id
    ignoring = SamplingParams(max_new_tokens=12, temperature=0.0, stop_token_ids=(stop_id,), ignore_eos=True)
    assert alone(engine, prompt, ignoring) == free


def test_max_new_tokens_and_max_model_len_end_with_length(tiny_checkpoint):
    eng = make_engine(tiny_checkpoint, max_model_len=64)
    assert eng.max_model_len == 64
    eng.add("a", prompts_of([60])[0], SamplingParams(max_new_tokens=10, temperature=0.0, ignore_eos=True))
    eng.add("b", prompts_of([10])[0], SamplingParams(max_new_tokens=3, temperature=0.0, ignore_eos=True))
    got = {"a": [], "b": []}
    reasons = {}
    while eng.has_work():
        for rid, d in eng.step():
            got[rid] += d.token_ids
            if d.finish_reason:
                reasons[rid] = d.finish_reason
    assert (len(got["a"]), len(got["b"])) == (4, 3)  # a hits 64 positions, b its 3 new tokens
    assert reasons == {"a": "length", "b": "length"}
    with pytest.raises(ValueError, match="prompt has 64 tokens but max_model_len is 64: at most 63"):
        eng.add("c", [1] * 64, GREEDY)
    with pytest.raises(ValueError, match=r"token id 201088, outside the vocabulary \[0, 201088\)"):
        eng.add("d", [5, 201088], GREEDY)
    with pytest.raises(ValueError, match="prompt is empty"):
        eng.add("e", [], GREEDY)


def test_kv_cache_smaller_than_max_model_len_is_refused(tiny_checkpoint):
    # 512 slots shared by full and sliding layers: one sequence of n tokens also keeps its last 128
    # (8 blocks of 16) for the sliding layers, so the longest is 512 - 128 = 384.
    with pytest.raises(
        ValueError,
        match=r"KV cache holds 384 tokens \(512 slots, with a sequence's last 128 for the sliding layers\), "
        r"fewer than max_model_len 1024",
    ):
        make_engine(tiny_checkpoint, kv_cache_tokens=512, max_model_len=1024)
    # Without an explicit max_model_len the cache size caps it.
    assert make_engine(tiny_checkpoint, kv_cache_tokens=512).max_model_len == 384

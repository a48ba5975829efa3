"""Seeded sampling in the engine on the Triton kernels (the tiny model cut as in test_kernel_engine):
draws reproducible by seed and batch-invariant, and top-k requests filtered without a vocabulary sort
with the sort's tokens. On CPU the kernels run in Triton's interpreter; on a GPU compiled."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from gptoss.sampling import SamplingParams  # noqa: E402
from tests.gptoss.kernels.conftest import DEVICE  # noqa: E402
from tests.gptoss.kernels.test_kernel_engine import make_engine, prompts_of  # noqa: E402


@pytest.fixture(scope="module")
def triton_eng(kernel_checkpoint):
    return make_engine(kernel_checkpoint, "triton")


def test_triton_sampling_is_seeded(triton_eng):
    prompts = prompts_of([12, 30, 7], seed=4)
    sp = [SamplingParams(max_new_tokens=6, temperature=1.0, seed=s, ignore_eos=True) for s in (1, 2, 3)]
    first = triton_eng.generate(prompts, sp)
    assert triton_eng.generate(prompts, sp) == first  # the same batch and seeds: the same draws
    assert [len(t) for t in first] == [6, 6, 6]
    other = SamplingParams(max_new_tokens=6, temperature=1.0, seed=9, ignore_eos=True)
    assert triton_eng.generate(prompts[:1], [other])[0] != first[0]


def test_top_k_requests_are_filtered_without_a_sort_and_draw_the_same(triton_eng, monkeypatch):
    """A batch whose sampled requests all ask a small top_k filters by mask_within_top_k (k_cap = the
    largest top_k), a top-p-only request sends the batch to the search (TOP_P_SEARCH), or with it off
    to the sort; the tokens are the sort's."""
    import gptoss.kernel_runner as kr

    prompts = prompts_of([12, 30, 7], seed=5)
    sp = [
        SamplingParams(max_new_tokens=4, temperature=0.9, top_k=k, top_p=p, seed=s, ignore_eos=True)
        for k, p, s in ((20, 1.0, 1), (5, 0.8, 2), (0, 1.0, 3))
    ]
    caps = []
    real = kr.sample
    monkeypatch.setattr(kr, "sample", lambda *a, **kw: caps.append(kw["k_cap"]) or real(*a, **kw))
    fast = triton_eng.generate(prompts, sp)
    assert caps and set(caps) == {20}  # the unfiltered third request does not count
    caps.clear()
    monkeypatch.setattr(kr, "filter_plan", lambda *_: (0, False))  # the sort, as before
    assert triton_eng.generate(prompts, sp) == fast
    assert set(caps) == {0}
    monkeypatch.undo()
    monkeypatch.setattr(kr, "sample", lambda *a, **kw: caps.append(kw["k_cap"]) or real(*a, **kw))
    caps.clear()
    top_k = SamplingParams(max_new_tokens=2, temperature=0.9, top_k=20, seed=1, ignore_eos=True)
    top_p_only = SamplingParams(max_new_tokens=2, temperature=0.9, top_p=0.5, seed=4, ignore_eos=True)
    from gptoss.kernels import sampling_filter

    monkeypatch.setattr(sampling_filter, "TOP_P_SEARCH", False)  # the sort, as before the search
    sorted_ = triton_eng.generate(prompts[:2], [top_k, top_p_only])  # every step holds both
    assert caps and set(caps) == {0}
    # with the search on (sampling_filter.TOP_P_SEARCH, the default): the top-p row searched, the
    # top-k row cut at k_cap 20, the sort's tokens
    monkeypatch.setattr(sampling_filter, "TOP_P_SEARCH", True)
    plans = []
    monkeypatch.setattr(
        kr, "sample", lambda *a, **kw: plans.append((kw["k_cap"], kw["top_p_search"])) or real(*a, **kw)
    )
    assert triton_eng.generate(prompts[:2], [top_k, top_p_only]) == sorted_
    assert plans and set(plans) == {(20, True)}


# On an H100 the logits of one sequence differ by ~1.5e-5 (of a std of 4) between a batch of 3 and
# alone (float32; the MoE tiles and cuBLAS kernels depend on the batch size), and that flipped a
# Gumbel draw at the second token in every run so far; in the interpreter the test passes.
@pytest.mark.xfail(DEVICE == "cuda", reason="sampled tokens are batch-sensitive on GPU (see comment)")
def test_triton_sampling_is_batch_invariant(triton_eng):
    # Every prompt longer than moe_decode.MAX_T (16) and all three in one 64-token step: each prefill
    # runs the same MoE kernels alone and batched (the MoE switches kernels at T = 16, and the
    # interpreter's numpy sums differ between them); decode steps (T 3 vs 1) take the decode path both.
    prompts = prompts_of([17, 20, 25], seed=4)
    sp = [SamplingParams(max_new_tokens=6, temperature=1.0, seed=s, ignore_eos=True) for s in (1, 2, 3)]
    together = triton_eng.generate(prompts, sp)
    alone = [triton_eng.generate([p], [s])[0] for p, s in zip(prompts, sp, strict=True)]
    assert together == alone


def test_top_k_and_top_p_requests_decode_in_bursts_with_the_single_step_draws(
    triton_eng, kernel_checkpoint, monkeypatch
):
    """A batch holding filtered requests runs multi-step bursts (its filters need no host sync), each
    step drawn as an ordinary step draws it: the same k_cap, the same tokens as decode_steps=1."""
    import gptoss.kernel_runner as runner

    kr = triton_eng.runner.kernel_runner
    assert triton_eng.config.decode_steps > 1
    bursts, caps = [], []
    real_multi, real_sample = kr.launch_multi, runner.sample
    monkeypatch.setattr(
        kr, "launch_multi", lambda b, k, ahead=0: bursts.append(k) or real_multi(b, k, ahead=ahead)
    )
    monkeypatch.setattr(
        runner,
        "sample",
        lambda *a, **kw: (
            caps.append((kw["filtered"], kw["k_cap"], kw["top_p_search"])) or real_sample(*a, **kw)
        ),
    )
    prompts = prompts_of([11, 6], seed=7)
    small_k = [
        SamplingParams(max_new_tokens=7, temperature=0.9, top_k=k, top_p=p, seed=s, ignore_eos=True)
        for k, p, s in ((20, 0.8, 1), (5, 1.0, 2))
    ]
    with_top_p = [
        small_k[0],
        SamplingParams(max_new_tokens=7, temperature=0.9, top_p=0.5, seed=3, ignore_eos=True),
    ]
    got = [triton_eng.generate(prompts, sp) for sp in (small_k, with_top_p)]
    assert bursts and all(k > 1 for k in bursts)
    # every draw filtered: by the per-row top-k at the batch's largest top_k; with the top-p-only
    # request, its row by the search and the top-k row by filter_cut at that top_k
    assert set(caps) == {(True, 20, False), (True, 20, True)}
    single = make_engine(kernel_checkpoint, "triton", decode_steps=1)
    assert [single.generate(prompts, sp) for sp in (small_k, with_top_p)] == got
    assert [len(t) for t in got[0] + got[1]] == [7, 7, 7, 7]


def test_a_batch_filters_only_its_filtered_rows(triton_eng, monkeypatch):
    """One top-p request among three: sample() gets its row's index (the other two drawn unfiltered),
    in single steps and bursts alike, and the tokens are those of filtering every row."""
    import gptoss.kernel_runner as runner

    prompts = prompts_of([9, 14, 5], seed=8)
    sp = [
        SamplingParams(max_new_tokens=6, temperature=1.0, seed=11, ignore_eos=True),
        SamplingParams(max_new_tokens=6, temperature=0.8, top_p=0.5, seed=12, ignore_eos=True),
        SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True),
    ]
    real = runner.sample
    seen = []
    monkeypatch.setattr(runner, "sample", lambda *a, **kw: seen.append(kw["rows"]) or real(*a, **kw))
    got = triton_eng.generate(prompts, sp)
    assert seen and all(r is not None and r.tolist() == [1] for r in seen)
    monkeypatch.setattr(runner, "sample", lambda *a, **kw: real(*a, **(kw | {"rows": None})))
    assert triton_eng.generate(prompts, sp) == got


def test_an_unfiltered_draw_takes_lm_heads_bf16_logits_with_the_float32_copys_tokens(
    kernel_checkpoint, monkeypatch
):
    """A bf16 engine's unfiltered sampled steps (MLPerf's temperature 1, top_p 1) hand sample() the
    lm_head's bf16 logits, in single steps and bursts alike, and draw the tokens of the float32 copy
    they used to make; so does a batch whose filtered rows sample() widens alone; a batch filtered
    whole still gets float32 (its filters read every row)."""
    import torch

    import gptoss.kernel_runner as runner

    eng = make_engine(kernel_checkpoint, "triton", dtype="bfloat16")
    kr = eng.runner.kernel_runner
    assert eng.config.decode_steps > 1
    real_sample, real_multi = runner.sample, kr.launch_multi
    seen, bursts = [], []

    def spy(logits, *a, **kw):
        seen.append((logits.dtype, kw["filtered"], kw["rows"] is not None))
        return real_sample(logits, *a, **kw)

    monkeypatch.setattr(runner, "sample", spy)
    monkeypatch.setattr(
        kr, "launch_multi", lambda b, k, ahead=0: bursts.append(k) or real_multi(b, k, ahead=ahead)
    )
    prompts = prompts_of([9, 14], seed=9)
    sp = [SamplingParams(max_new_tokens=6, temperature=1.0, seed=s, ignore_eos=True) for s in (21, 22)]
    got = eng.generate(prompts, sp)
    assert bursts and set(seen) == {(torch.bfloat16, False, False)}
    assert [len(t) for t in got] == [6, 6]
    monkeypatch.setattr(runner, "sample", lambda logits, *a, **kw: real_sample(logits.float(), *a, **kw))
    assert eng.generate(prompts, sp) == got  # as before: drawn from a float32 copy
    monkeypatch.setattr(runner, "sample", spy)
    seen.clear()
    top_k = SamplingParams(max_new_tokens=3, temperature=1.0, top_k=5, seed=1, ignore_eos=True)
    eng.generate(prompts, [top_k, top_k])
    assert set(seen) == {(torch.float32, True, False)}
    # one top-p request of three: bf16, its row widened and filtered alone; the float32 copy's tokens
    mixed = [
        sp[0],
        SamplingParams(max_new_tokens=6, temperature=0.8, top_p=0.5, seed=12, ignore_eos=True),
        sp[1],
    ]
    three = prompts_of([9, 14, 5], seed=10)
    seen.clear()
    got = eng.generate(three, mixed)
    assert set(seen) == {(torch.bfloat16, True, True)}
    monkeypatch.setattr(runner, "sample", lambda logits, *a, **kw: real_sample(logits.float(), *a, **kw))
    assert eng.generate(three, mixed) == got


def test_the_warm_up_draws_an_unfiltered_step(kernel_checkpoint, monkeypatch):
    """The start-up warm-up reaches the draw MLPerf's runs take every step (temperature 1, no filter:
    lm_head's own logits, KernelRunner._draw_logits), so its kernel compiles there, not in a run.
    (Its unfiltered request is the fourth short one: an engine of 8 sequences has it.)"""
    import gptoss.kernel_runner as runner
    from gptoss.warmup import warm_up

    eng = make_engine(kernel_checkpoint, "triton", max_num_seqs=8)
    real = runner.sample
    drawn = []

    def spy(logits, temperature, *a, **kw):
        drawn.append((kw["filtered"], temperature.max().item()))
        return real(logits, temperature, *a, **kw)

    monkeypatch.setattr(runner, "sample", spy)
    warm_up(eng, sizes=[])
    assert (False, 1.0) in drawn and any(f for f, _ in drawn)  # unfiltered, and filtered steps too

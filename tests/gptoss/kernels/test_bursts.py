"""Pipelined multi-step decode (LLMEngine._land): a greedy burst's continuation is launched before the
burst is read, from the inputs its last step left on the device. Against the torch reference engine
(no bursts; test_kernel_engine holds the kernels to its tokens, and it runs in a fraction of the
interpreter's time), on the tiny checkpoint in float32: the same tokens, continuations that did run,
ids computed past a stop or an abort dropped, a new request admitted once the burst in flight is
read, and every KV block free at the end."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from gptoss.sampling import SamplingParams  # noqa: E402
from tests.gptoss.kernels.test_kernel_engine import make_engine, prompts_of  # noqa: E402


@pytest.fixture(scope="module")
def pair(kernel_checkpoint):
    """(the kernels in bursts of 3 steps, the torch reference one step at a time)"""
    return make_engine(kernel_checkpoint, "triton", decode_steps=3), make_engine(kernel_checkpoint, "torch")


@pytest.fixture
def launches(pair, monkeypatch):
    """The `ahead` of every launch_multi of the burst engine (0: a fresh burst, > 0: a continuation)."""
    kr = pair[0].runner.kernel_runner
    seen: list[int] = []
    real = kr.launch_multi

    def spy(batch, k, ahead=0):
        seen.append(ahead)
        return real(batch, k, ahead=ahead)

    monkeypatch.setattr(kr, "launch_multi", spy)
    return seen


def greedy(n: int, stop: tuple[int, ...] = ()) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=not stop, stop_token_ids=stop)


def all_free(eng) -> bool:
    bm = eng.scheduler.bm
    return bm.full.num_free == bm.full.num_blocks and bm.ring.num_free == bm.ring.num_blocks


def run(eng, requests: dict[str, tuple[list[int], SamplingParams]]) -> dict[str, list[int]]:
    for rid, (prompt, sp) in requests.items():
        eng.add(rid, prompt, sp)
    got: dict[str, list[int]] = {rid: [] for rid in requests}
    while eng.has_work():
        for rid, delta in eng.step():
            got[rid] += delta.token_ids
    return got


def test_continuations_give_the_single_step_tokens(pair, launches):
    bursts, single = pair
    prompts = prompts_of([7, 12], seed=11)
    want = single.generate(prompts, [greedy(14), greedy(17)])
    kr = bursts.runner.kernel_runner
    kr.host_times.clear()
    got = run(bursts, {"a": (prompts[0], greedy(14)), "b": (prompts[1], greedy(17))})
    assert [got["a"], got["b"]] == want
    # 13 and 16 decode steps in bursts of 3: continuations 3 ahead, and fresh bursts once a ends
    assert launches.count(3) >= 3 and launches[0] == 0
    # the host time of a launch is kept with the steps it ran (the bench's per-step figure): the
    # prefill's one and b's 16 decode steps, none past b's end
    steps = [n for _, n in kr.host_times]
    assert sum(steps) == 17 and steps.count(3) >= 3 and steps[0] == 1
    assert bursts._burst is None and all_free(bursts)


def test_ids_past_a_stop_met_while_a_continuation_ran_are_dropped(pair, launches):
    bursts, single = pair
    prompts = prompts_of([9, 5], seed=12)
    ref = single.generate(prompts, [greedy(16), greedy(16)])
    # a's 6th id (the 5th decode step: the second burst, read while the third runs) stops it
    stop = ref[0][5]
    cut = ref[0][: ref[0].index(stop) + 1]
    got = run(bursts, {"a": (prompts[0], greedy(16, (stop,))), "b": (prompts[1], greedy(16))})
    assert got == {"a": cut, "b": ref[1]}
    # the continuation that ran past a's stop is followed by a fresh burst of b alone (inputs sent again)
    assert 0 in launches[launches.index(3) + 1 :]
    assert bursts._burst is None and all_free(bursts)


def test_an_abort_while_a_continuation_runs_drops_its_ids(pair, launches):
    bursts, single = pair
    prompts = prompts_of([6, 10], seed=13)
    want_b = single.generate(prompts[1:], [greedy(15)])[0]
    bursts.add("a", prompts[0], greedy(15))
    bursts.add("b", prompts[1], greedy(15))
    got = {"a": [], "b": []}
    while 3 not in launches:  # until a continuation is launched: it is in flight for both
        for rid, delta in bursts.step():
            got[rid] += delta.token_ids
    assert bursts._burst is not None and bursts._burst[1].n == 2
    assert bursts.abort("a")
    a_before = list(got["a"])
    while bursts.has_work():
        for rid, delta in bursts.step():
            got[rid] += delta.token_ids
    assert got["a"] == a_before and got["b"] == want_b
    assert bursts._burst is None and all_free(bursts)


def test_a_request_arriving_during_a_burst_joins_once_it_is_read(pair, launches):
    bursts, single = pair
    prompts = prompts_of([8, 4], seed=14)
    want = single.generate(prompts, [greedy(20), greedy(6)])
    bursts.add("a", prompts[0], greedy(20))
    got = {"a": [], "b": []}
    while bursts._burst is None:
        for rid, delta in bursts.step():
            got[rid] += delta.token_ids
    bursts.add("b", prompts[1], greedy(6))
    n = len(launches)
    for rid, delta in bursts.step():  # reads the burst in flight and launches no continuation
        got[rid] += delta.token_ids
    assert len(launches) == n and bursts._burst is None
    while bursts.has_work():
        for rid, delta in bursts.step():
            got[rid] += delta.token_ids
    assert [got["a"], got["b"]] == want
    assert all_free(bursts)


def test_host_time_per_step_divides_a_launch_by_the_steps_it_ran():
    from types import SimpleNamespace

    from gptoss.kernel_runner import KernelRunner

    # a prefill launch (3 ms), then a burst of 4 decode steps (8 ms) and a single step (2 ms)
    times = SimpleNamespace(host_times=[(0.003, 1), (0.008, 4), (0.002, 1)])
    assert KernelRunner.host_ms_per_step(times, skip=1) == pytest.approx(2.0)
    assert KernelRunner.host_ms_per_step(times) == pytest.approx(13 / 6)
    assert KernelRunner.host_ms_per_step(SimpleNamespace(host_times=[])) == 0.0

"""--warmup N: untimed queries before LoadGen starts, at the dataset's prompt lengths but never its
prompts, recorded in run.json; LoadGen's own queries are unchanged; all failing stops the run."""

from __future__ import annotations

import json

import pytest

from harness.dataset import load_dataset
from harness.runner import EXIT_FAILED_QUERIES, EXIT_OK, EXIT_USAGE
from harness.warmup import OUTPUT_TOKENS, warmup_prompts, waves
from tests.harness.runkit import run_cli, run_json, run_quick_start, run_server_p90


def test_prompts_span_the_lengths_and_are_random_ids_in_the_vocab():
    lens = [50, 10, 30, 20, 40]
    prompts = warmup_prompts(lens, 3, vocab_size=100)
    assert [len(p) for p in prompts] == [10, 30, 50]  # shortest, median, longest
    assert all(0 <= t < 100 for p in prompts for t in p)
    assert prompts == warmup_prompts(lens, 3, vocab_size=100)  # seeded
    assert len(set(map(tuple, prompts))) == 3
    assert [len(p) for p in warmup_prompts(lens, 7, 100)] == [10, 20, 20, 30, 40, 40, 50]
    assert warmup_prompts(lens, 0, 100) == [] and warmup_prompts([], 4, 100) == []


@pytest.mark.parametrize(
    "n,sizes", [(1, [1]), (2, [1, 1]), (4, [1, 1, 2]), (8, [1, 1, 2, 4]), (10, [1, 1, 2, 4, 2])]
)
def test_waves_double_and_add_up(n, sizes):
    assert waves(n) == sizes


def _server(tmp_path, synth_parquet, *extra) -> int:
    return run_server_p90(tmp_path, synth_parquet, "--target-qps", 50, *extra)


def test_warmup_queries_go_first_and_leave_loadgens_run_alone(fake_backend, synth_parquet, tmp_path):
    assert _server(tmp_path, synth_parquet, "--warmup", 5) == EXIT_OK
    fake = fake_backend.LAST
    dataset = {tuple(p.tolist()) for p in load_dataset(synth_parquet).prompts}
    warm = [p for p in fake.yielded if p not in dataset]
    assert len(warm) == 5
    lens = sorted(len(p) for p in dataset)
    assert sorted(len(p) for p in warm) == [len(p) for p in warmup_prompts(lens, 5, 201088)]
    assert all(len(out) == OUTPUT_TOKENS for p in warm for out in fake.yielded[p])
    assert fake.calls == 48 + 5
    record = run_json(tmp_path / "server" / "performance")
    assert record["warmup"]["queries"] == 5 and record["warmup"]["failed"] == 0
    assert (record["queries"]["issued"], record["queries"]["completed"]) == (48, 48)


def test_all_warmup_queries_failing_stops_before_loadgen(fake_backend, synth_parquet, tmp_path, capsys):
    code = _server(tmp_path, synth_parquet, "--warmup", 3, "--fake-fail-every", 1)
    assert code == EXIT_USAGE
    out = capsys.readouterr()
    want = "all 3 warm-up queries failed; the first: InjectedFailure: injected failure (every 1th request)"
    assert want in out.out + out.err
    assert fake_backend.LAST.calls == 3  # LoadGen never started
    assert not (tmp_path / "server" / "performance" / "mlperf_log_summary.txt").exists()


def test_some_warmup_failures_are_a_recorded_warning(fake_backend, synth_parquet, tmp_path, capsys):
    # every 2nd request fails: warm-up calls 2 and 4 (of 4), then LoadGen's even calls fail too
    code = _server(tmp_path, synth_parquet, "--warmup", 4, "--fake-fail-every", 2)
    assert code == EXIT_FAILED_QUERIES  # the timed run's own failures still fail it
    record = run_json(tmp_path / "server" / "performance")
    assert record["warmup"]["failed"] == 2
    assert "warm-up: 4 queries in" in capsys.readouterr().out


def test_negative_warmup_is_a_flag_error(fake_backend, capsys):
    with pytest.raises(SystemExit):
        run_cli(["--backend", "fake", "--warmup", "-1"])
    assert "argument --warmup: must be >= 0, got -1" in capsys.readouterr().err


@pytest.mark.timeout(240)
def test_gptoss_engine_takes_a_warmup(tmp_path):
    """The real engine on the tiny checkpoint (the quick start's) takes the warm-up, then a VALID run."""
    done = run_quick_start(tmp_path, "--scenario", "offline", "--warmup", "3")
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads((tmp_path / "out" / "offline" / "performance" / "run.json").read_text())
    assert record["warmup"]["queries"] == 3 and record["warmup"]["failed"] == 0
    assert (record["queries"]["issued"], record["queries"]["completed"]) == (24, 24)
    assert "warm-up: 3 queries in" in done.stdout

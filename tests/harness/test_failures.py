"""Failure injection: a backend that raises and stalls still gives a run that ends, with every
query logged exactly once, only real tokens, the failures counted and a non-zero exit."""

from __future__ import annotations

import time

import pytest

from harness.dataset import load_dataset
from harness.runner import EXIT_FAILED_QUERIES
from tests.harness.runkit import accuracy_entries, run_cli, run_json


@pytest.mark.timeout(60)
@pytest.mark.parametrize("scenario", ["offline", "server"])
def test_raising_and_stalling_backend_ends_with_every_query_logged(
    fake_backend, synth_parquet, tmp_path, capsys, scenario
):
    # A stall is for ever: were it not timed out, the test's own 60 s time-out would end it.
    code = run_cli(
        [
            "--backend",
            "fake",
            "--scenario",
            scenario,
            "--input-file",
            synth_parquet,
            "--accuracy",
            "--output-dir",
            tmp_path,
            "--target-qps",
            100,
            "--timeout",
            1,
            "--fake-fail-every",
            5,
            "--fake-stall-every",
            7,
        ]
    )
    assert code == EXIT_FAILED_QUERIES
    log_dir = tmp_path / scenario / "accuracy"
    ds = load_dataset(synth_parquet)
    entries = accuracy_entries(log_dir)
    assert sorted(e["qsl_idx"] for e in entries) == list(range(16))  # each query completed exactly once
    backend = fake_backend.LAST
    for e in entries:
        (sent,) = backend.yielded[tuple(ds.prompts[e["qsl_idx"]].tolist())]
        assert e["tokens"] == sent  # the tokens received before the failure, nothing invented
        assert e["token_count"] == len(sent)
        if scenario == "server":
            assert e["first"] == sent[:1]
    # calls 5, 10, 15 raise; 7, 14 stall (checked after the raise, so 35 would raise)
    failed = {e["qsl_idx"] for e in entries if len(e["tokens"]) == 1}
    assert len(failed) == 5
    record = run_json(log_dir)
    assert record["failures"]["count"] == 5
    assert record["failures"]["reasons"] == {
        "InjectedFailure: injected failure (every 5th request)": 3,
        "timeout: the query took longer than 1 s": 2,
    }
    assert record["exit_code"] == EXIT_FAILED_QUERIES
    out = capsys.readouterr().out
    assert "5 of 16 queries failed" in out
    assert "3 x InjectedFailure: injected failure (every 5th request)" in out
    assert "2 x timeout: the query took longer than 1 s" in out


@pytest.mark.timeout(60)
def test_server_failure_before_the_first_token_completes_with_no_tokens(
    fake_backend, synth_parquet, tmp_path
):
    # LoadGen's Server bookkeeping reads a first-token record for every sample: a query that
    # fails before any token must still get one (empty), or LoadGen reads out of bounds.
    code = run_cli(
        [
            "--backend",
            "fake",
            "--scenario",
            "server",
            "--input-file",
            synth_parquet,
            "--accuracy",
            "--output-dir",
            tmp_path,
            "--target-qps",
            100,
            "--fake-fail-every",
            2,
            "--fake-fail-at",
            0,
        ]
    )
    assert code == EXIT_FAILED_QUERIES
    entries = accuracy_entries(tmp_path / "server" / "accuracy")
    assert len(entries) == 16
    empty = [e for e in entries if e["tokens"] == []]
    assert len(empty) == 8
    assert all(e["first"] == [] and e["token_count"] == 0 for e in empty)
    assert all(len(e["tokens"]) > 1 for e in entries if e not in empty)


@pytest.mark.timeout(60)
def test_failures_make_a_valid_performance_run_exit_non_zero(fake_backend, synth_no_lens, tmp_path):
    code = run_cli(
        [
            "--backend",
            "fake",
            "--input-file",
            synth_no_lens,
            "--output-dir",
            tmp_path,
            "--min-duration",
            0,
            "--min-query-count",
            48,
            "--fake-fail-every",
            10,
        ]
    )
    assert code == EXIT_FAILED_QUERIES
    record = run_json(tmp_path / "offline" / "performance")
    assert record["failures"]["count"] == 4
    assert record["queries"]["completed"] == 48  # a multiple of the 12 rows (equal-issue mode)


@pytest.mark.timeout(60)
def test_a_backend_that_ignores_cancellation_cannot_hold_a_query(fake_backend, synth_parquet, tmp_path):
    # Every 4th request swallows the cancel and goes on streaming 40 s later; the SUT completes it
    # at the timeout anyway, and the late tokens never reach LoadGen. Had the run waited for the
    # backend it would take those 40 s; a run that does not wait takes a few.
    t0 = time.monotonic()
    code = run_cli(
        [
            "--backend",
            "fake",
            "--input-file",
            synth_parquet,
            "--accuracy",
            "--output-dir",
            tmp_path,
            "--timeout",
            0.5,
            "--fake-stall-every",
            4,
            "--fake-stubborn",
            40,
        ]
    )
    assert time.monotonic() - t0 < 20
    assert code == EXIT_FAILED_QUERIES
    entries = accuracy_entries(tmp_path / "offline" / "accuracy")
    assert sorted(e["qsl_idx"] for e in entries) == list(range(16))
    assert sum(len(e["tokens"]) == 1 for e in entries) == 4
    assert run_json(tmp_path / "offline" / "accuracy")["failures"]["reasons"] == {
        "timeout: the query took longer than 0.5 s": 4
    }


def test_a_backend_that_cannot_start_exits_2_and_says_why(fake_backend, tmp_path, capsys):
    assert run_cli(["--backend", "fake", "--output-dir", tmp_path, "--fake-fail-start"]) == 2
    assert "error: fake server at http://127.0.0.1:9 is not reachable\n" in capsys.readouterr().out
    record = run_json(tmp_path / "offline" / "performance")
    assert record["status"] == "error"
    assert record["error"] == "BackendError: fake server at http://127.0.0.1:9 is not reachable"


def test_a_backend_that_is_not_installed_names_the_setup_call(fake_backend, monkeypatch, tmp_path, capsys):
    import backends

    spec = backends.SPECS["fake"]
    monkeypatch.setitem(
        backends.SPECS,
        "fake",
        backends.Spec(spec.module, spec.cls, ("no_such_module_xyz",), "./setup.sh --backend fake"),
    )
    assert run_cli(["--backend", "fake", "--output-dir", tmp_path]) == 2
    assert (
        "error: backend 'fake' needs no_such_module_xyz, which is not installed: run `./setup.sh --backend "
        "fake`" in capsys.readouterr().out
    )

"""Real LoadGen runs of the one SUT, Offline and Server, against the deterministic fake backend."""

from __future__ import annotations

import pytest

from harness.dataset import load_dataset
from harness.generation import load_sampling
from harness.runner import sample_params
from tests.harness.runkit import accuracy_entries, detail_values, run_cli, run_json, summary_field

pytestmark = pytest.mark.timeout(120)


def _expected(path, accuracy: bool):
    ds = load_dataset(path)
    params = sample_params(load_sampling(None, accuracy=accuracy), ds)
    from tests.harness.fakes import expected_tokens

    return [expected_tokens(p.tolist(), q) for p, q in zip(ds.prompts, params, strict=True)], ds


def _loadgen_token_count(values: dict, server: bool, samples: int) -> float:
    # LoadGen reports rates, not the count: tokens/s and samples/s share one denominator.
    if server:
        return (
            values["result_completed_tokens_per_second"]
            / values["result_completed_samples_per_sec"]
            * (samples - 1)
        )
    return values["result_tokens_per_second"] / values["result_samples_per_second"] * samples


@pytest.mark.parametrize("scenario", ["offline", "server", "interactive"])
def test_accuracy_log_holds_exactly_the_backend_tokens(fake_backend, synth_parquet, tmp_path, scenario):
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
            200,
        ]
    )
    # The fake's tokens answer nothing: every query succeeds and accuracy FAILs (exit 1, as
    # python -m evaluation).
    assert code == 1
    log_dir = tmp_path / scenario / "accuracy"
    assert run_json(log_dir)["failures"]["count"] == 0 and run_json(log_dir)["evaluation"]["passed"] is False
    expected, ds = _expected(synth_parquet, accuracy=True)
    entries = accuracy_entries(log_dir)
    assert sorted(e["qsl_idx"] for e in entries) == list(range(len(ds)))  # every sample exactly once
    for e in entries:
        want = expected[e["qsl_idx"]]
        assert e["tokens"] == want
        assert len(want) == ds.output_lens[e["qsl_idx"]]  # per-row max_output_len honoured (ignore_eos)
        assert e["token_count"] == len(want)  # n_tokens = len, not the reference's len - 1
        if scenario != "offline":
            assert e["first"] == want[:1]  # FirstTokenComplete carried the real first token
        else:
            assert "token_data" not in e
    # what the backend yielded is what LoadGen logged
    backend = fake_backend.LAST
    assert backend.entered and backend.exited
    logged = {tuple(ds.prompts[e["qsl_idx"]].tolist()): e["tokens"] for e in entries}
    assert {k: v[0] for k, v in backend.yielded.items()} == logged
    record = run_json(log_dir)
    assert record["status"] == "finished" and record["exit_code"] == 1
    assert record["queries"] == {"issued": 16, "completed": 16, "output_tokens": sum(map(len, expected))}
    assert record["failures"]["count"] == 0


def test_offline_performance_is_valid_and_token_counts_agree(fake_backend, synth_parquet, tmp_path):
    code = run_cli(
        [
            "--backend",
            "fake",
            "--input-file",
            synth_parquet,
            "--output-dir",
            tmp_path,
            "--min-duration",
            0,
            "--min-query-count",
            64,
        ]
    )
    assert code == 0
    log_dir = tmp_path / "offline" / "performance"
    assert summary_field(log_dir, "Result is") == "VALID"
    record = run_json(log_dir)
    generated = sum(len(t) for ts in fake_backend.LAST.yielded.values() for t in ts)
    assert record["queries"]["completed"] == 64
    assert record["queries"]["output_tokens"] == generated
    assert _loadgen_token_count(detail_values(log_dir), False, 64) == pytest.approx(generated, rel=1e-4)
    assert record["result"]["validity"] == "VALID"
    assert record["loadgen_settings"]["min_query_count"] == 64


@pytest.fixture
def generous_limits(tmp_path):
    """Latency limits no pace of an instant backend comes near: VALID then says every query completed,
    whatever the machine's speed (speed is for bench/)."""
    conf = tmp_path / "user.conf"
    conf.write_text("gpt-oss-120b.Server.ttft_latency = 60000\ngpt-oss-120b.Server.tpot_latency = 10000\n")
    return conf


def test_server_performance_is_valid_and_token_counts_agree(
    fake_backend, synth_no_lens, tmp_path, generous_limits
):
    # Early stopping needs several hundred queries; an instant backend at 600 QPS takes ~1 s.
    code = run_cli(
        [
            "--backend",
            "fake",
            "--scenario",
            "server",
            "--input-file",
            synth_no_lens,
            "--output-dir",
            tmp_path,
            "--user-conf",
            generous_limits,
            "--target-qps",
            600,
            "--min-duration",
            1,
            "--min-query-count",
            600,
        ]
    )
    assert code == 0
    log_dir = tmp_path / "server" / "performance"
    assert summary_field(log_dir, "Result is") == "VALID"
    record = run_json(log_dir)
    completed = record["queries"]["completed"]
    assert completed >= 600
    generated = sum(len(t) for ts in fake_backend.LAST.yielded.values() for t in ts)
    assert fake_backend.LAST.calls == completed
    assert record["queries"]["output_tokens"] == generated
    assert _loadgen_token_count(detail_values(log_dir), True, completed) == pytest.approx(generated, rel=1e-4)
    assert (record["result"]["ttft_limit_ns"], record["result"]["tpot_limit_ns"]) == (
        60_000_000_000,
        10_000_000_000,
    )


def test_interactive_uses_the_interactive_latency_limits(fake_backend, synth_no_lens, tmp_path):
    # Whether 15 ms per token holds on this machine is not the question: the verdict is only
    # checked to agree with the exit code.
    code = run_cli(
        [
            "--backend",
            "fake",
            "--scenario",
            "interactive",
            "--input-file",
            synth_no_lens,
            "--output-dir",
            tmp_path,
            "--target-qps",
            600,
            "--min-duration",
            1,
            "--min-query-count",
            600,
        ]
    )
    record = run_json(tmp_path / "interactive" / "performance")
    assert record["loadgen_settings"]["scenario"] == "Server"
    assert record["loadgen_settings"]["ttft_latency"] == 2_000_000_000
    assert record["loadgen_settings"]["tpot_latency"] == 15_000_000
    assert (record["result"]["ttft_limit_ns"], record["result"]["tpot_limit_ns"]) == (
        2_000_000_000,
        15_000_000,
    )
    assert record["result"]["validity"] in ("VALID", "INVALID")
    assert code == (0 if record["result"]["validity"] == "VALID" else 3)
    assert record["failures"]["count"] == 0 and record["queries"]["completed"] >= 600

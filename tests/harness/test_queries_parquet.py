"""queries.parquet agrees with LoadGen: one row per query LoadGen logged, the same tokens, and the
failures run.json counts, also when the backend raises and stalls."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from harness.queries import COLUMNS, read_queries
from harness.runner import EXIT_FAILED_QUERIES
from tests.harness.runkit import accuracy_entries, detail_values, run_cli, run_json

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("scenario", ["offline", "server"])
def test_records_match_the_accuracy_log_with_injected_failures(
    fake_backend, synth_parquet, tmp_path, scenario
):
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
    q = read_queries(log_dir)
    assert tuple(q.columns) == COLUMNS
    entries = accuracy_entries(log_dir)
    assert len(q) == len(entries) == 16
    assert sorted(q["qsl_idx"]) == sorted(e["qsl_idx"] for e in entries)
    # the tokens LoadGen logged for each sample, the count the SUT recorded
    assert dict(zip(q["qsl_idx"], q["output_tokens"], strict=True)) == {
        e["qsl_idx"]: e["token_count"] for e in entries
    }
    record = run_json(log_dir)
    assert int(q["output_tokens"].sum()) == record["queries"]["output_tokens"]
    failed = q[q["error"] != ""]
    assert Counter(failed["error"]) == record["failures"]["reasons"]
    # calls 5, 10, 15 raise; 7 and 14 stall and are timed out after 1 s
    assert Counter(failed["error_name"]) == {"InjectedFailure": 3, "timeout": 2}
    assert set(failed["qsl_idx"]) == {
        i for reason in record["failures"]["examples_qsl_idx"].values() for i in reason
    }
    ok = q[q["error"] == ""]
    assert (ok["output_tokens"] == ok["qsl_idx"].map(lambda i: len(_expected_row(synth_parquet, i)))).all()
    # times: issued <= first token <= completed; TPOT and TTFT as LoadGen defines them
    assert (q["issued_s"] >= 0).all() and q["issued_s"].is_monotonic_increasing
    assert (q["first_token_s"] >= q["issued_s"]).all() and (q["completed_s"] >= q["first_token_s"]).all()
    np.testing.assert_allclose(q["ttft_s"], q["first_token_s"] - q["issued_s"])
    many = q[q["output_tokens"] > 1]
    np.testing.assert_allclose(
        many["tpot_s"], (many["completed_s"] - many["first_token_s"]) / (many["output_tokens"] - 1)
    )
    assert q.loc[q["output_tokens"] <= 1, "tpot_s"].isna().all()
    timed_out = failed[failed["error_name"] == "timeout"]
    # asyncio runs a timer up to one clock resolution early (its loop rounds "due" up), hence 5 ms
    assert (timed_out["latency_s"] >= 1.0 - 0.005).all()


def _expected_row(path, idx: int) -> list[int]:
    from harness.dataset import load_dataset
    from harness.generation import load_sampling
    from harness.runner import sample_params
    from tests.harness.fakes import expected_tokens

    ds = load_dataset(path)
    params = sample_params(load_sampling(None, accuracy=True), ds)
    return expected_tokens(ds.prompts[idx].tolist(), params[idx])


@pytest.mark.parametrize("scenario", ["offline", "server"])
def test_one_row_per_query_loadgen_counted_in_performance_mode(
    fake_backend, synth_parquet, tmp_path, scenario
):
    code = run_cli(
        [
            "--backend",
            "fake",
            "--scenario",
            scenario,
            "--input-file",
            synth_parquet,
            "--output-dir",
            tmp_path,
            "--target-qps",
            400,
            "--min-duration",
            0,
            "--min-query-count",
            64,
        ]
    )
    assert code in (0, 3)  # 64 queries are too few for p99 early stopping in Server: INVALID is fine here
    log_dir = tmp_path / scenario / "performance"
    q = read_queries(log_dir)
    values = detail_values(log_dir)
    loadgen_count = (
        values["generated_samples_per_query"] if scenario == "offline" else values["result_query_count"]
    )
    assert len(q) == loadgen_count >= 64
    record = run_json(log_dir)
    assert record["queries"]["completed"] == len(q)
    assert int(q["output_tokens"].sum()) == record["queries"]["output_tokens"]
    assert (q["error"] == "").all() and record["failures"]["count"] == 0
    assert record["queries_file"] == str(log_dir / "queries.parquet")

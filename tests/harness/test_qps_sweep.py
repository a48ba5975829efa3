"""--qps-sweep: one backend for every target QPS, each run in its own directory, the sweep stops at
the first INVALID run and reports the highest VALID QPS; failures and bad flags still fail the run."""

from __future__ import annotations

import json

import pytest

from harness.runner import EXIT_FAILED_QUERIES, EXIT_INVALID, EXIT_OK
from harness.sweep import FILE_NAME
from tests.harness.runkit import run_cli, run_json, run_server_p90, summary_field

pytestmark = pytest.mark.timeout(180)


def _sweep(tmp_path, synth_parquet, qps: str, *extra) -> int:
    return run_server_p90(tmp_path, synth_parquet, "--qps-sweep", qps, *extra)


def test_sweep_stops_at_the_first_invalid_qps_and_reports_the_highest_valid(
    fake_backend, synth_parquet, tmp_path
):
    # one request at a time, 0.1 s a chunk of 8 tokens (a query 0.1-0.4 s): at 2 QPS the queue stays short;
    # at 1000 QPS all 48 arrive at once and most wait seconds for their first token (limit 3 s)
    code = _sweep(
        tmp_path, synth_parquet, "2,1000,2000", "--fake-serial", "--fake-delay", 0.1, "--fake-chunk", 8
    )
    assert code == EXIT_OK
    sweep = json.loads((tmp_path / FILE_NAME).read_text())
    assert [p["target_qps"] for p in sweep["points"]] == [2, 1000]  # 2000 never ran
    assert [p["validity"] for p in sweep["points"]] == ["VALID", "INVALID"]
    assert sweep["highest_valid_qps"] == 2
    assert sweep["points"][1]["ttft_p99_ms"] > 3000
    assert not (tmp_path / "qps_2000").exists()
    for qps, result in (("2", "VALID"), ("1000", "INVALID")):
        log_dir = tmp_path / f"qps_{qps}" / "server" / "performance"
        assert summary_field(log_dir, "Result is") == result
        assert float(summary_field(log_dir, "Scheduled samples per second")) > 0
        assert run_json(log_dir)["config"]["target_qps"] == float(qps)
    assert fake_backend.LAST.enters == 1  # started once for the whole sweep
    assert fake_backend.LAST.calls == 96
    assert sweep["warmup"] is None


def test_sweep_warms_up_once(fake_backend, synth_parquet, tmp_path):
    assert _sweep(tmp_path, synth_parquet, "2,3", "--warmup", 4) == EXIT_OK
    sweep = json.loads((tmp_path / FILE_NAME).read_text())
    assert sweep["warmup"]["queries"] == 4 and sweep["warmup"]["failed"] == 0
    assert fake_backend.LAST.calls == 4 + 48 + 48


def test_no_valid_qps_exits_invalid(fake_backend, synth_parquet, tmp_path):
    code = _sweep(tmp_path, synth_parquet, "1000", "--fake-serial", "--fake-delay", 0.1, "--fake-chunk", 8)
    assert code == EXIT_INVALID
    assert json.loads((tmp_path / FILE_NAME).read_text())["highest_valid_qps"] is None


def test_failed_queries_fail_the_sweep(fake_backend, synth_parquet, tmp_path):
    code = _sweep(tmp_path, synth_parquet, "50", "--fake-fail-every", 4)
    assert code == EXIT_FAILED_QUERIES
    point = json.loads((tmp_path / FILE_NAME).read_text())["points"][0]
    assert point["failed"] == 12
    assert json.loads((tmp_path / FILE_NAME).read_text())["highest_valid_qps"] is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scenario", "offline", "--qps-sweep", "1,2"], "--qps-sweep is for the server and interactive"),
        (["--scenario", "server", "--qps-sweep", "2,1"], "distinct and ascending, got [2.0, 1.0]"),
        (["--scenario", "server", "--qps-sweep", "1,x"], "expected comma-separated numbers, got '1,x'"),
        (
            ["--scenario", "server", "--qps-sweep", "1", "--target-qps", "3"],
            "either --target-qps or --qps-sweep",
        ),
        (["--scenario", "server", "--qps-sweep", "1", "--accuracy"], "runs in performance mode"),
    ],
)
def test_bad_sweep_flags_exit_2_with_the_reason(fake_backend, synth_parquet, tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as e:
        run_cli(["--backend", "fake", "--input-file", synth_parquet, "--output-dir", tmp_path, *args])
    assert e.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / FILE_NAME).exists()

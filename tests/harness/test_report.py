"""python -m harness.report and run_mlperf.py --report on real short runs: valid PNGs, report numbers
equal to LoadGen's summary, exact comparison ratios, clear errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from PIL import Image

from harness.report.__main__ import main as report_main
from harness.report.build import make_report
from harness.report.markdown import compare
from harness.report.runs import load_runs
from tests.harness.oraclekit import fake_with_oracle
from tests.harness.runkit import run_cli, summary_field

pytestmark = pytest.mark.timeout(300)

PNGS = ("latency_cdf.png", "throughput.png", "output_lengths.png")


def _server(out: Path, data: Path, delay: float, *extra) -> Path:
    code = run_cli(
        [
            "--backend",
            "fake",
            "--scenario",
            "server",
            "--input-file",
            data,
            "--output-dir",
            out,
            "--target-qps",
            100,
            "--min-duration",
            0,
            "--min-query-count",
            100,
            "--fake-delay",
            delay,
            *extra,
        ]
    )
    assert code in (0, 3)  # 100 queries are too few for p99 early stopping: usually INVALID
    return out / "server" / "performance"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, synth_parquet, tiny_checkpoint) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("report_runs")
    with fake_with_oracle():
        fast = _server(root / "fast", synth_parquet, 0.001, "--report")
        slow = _server(root / "slow", synth_parquet, 0.003)
    # the gptoss engine on the tiny random checkpoint, Offline
    code = run_cli(
        [
            "--backend",
            "gptoss",
            "--model-path",
            tiny_checkpoint,
            "--input-file",
            synth_parquet,
            "--max-samples",
            8,
            "--output-dir",
            root / "tiny",
            "--min-duration",
            0,
        ]
    )
    assert code == 0
    return {"fast": fast, "slow": slow, "tiny": root / "tiny" / "offline" / "performance"}


def _check_pngs(folder: Path) -> None:
    for name in PNGS:
        with Image.open(folder / name) as im:
            assert im.format == "PNG"
            assert im.size[0] >= 800 and im.size[1] >= 400, (name, im.size)
            im.verify()  # a truncated or corrupt file raises


def _table_value(md: str, metric: str) -> str:
    m = re.search(rf"^\| {re.escape(metric)} \| ([^|]+) \|", md, re.MULTILINE)
    assert m, f"{metric!r} not in report.md"
    return m.group(1).strip()


def _num(text: str) -> float:
    return float(text.split()[0].replace(",", ""))


def _assert_numbers_equal_summary(log_dir: Path, md: str, server: bool) -> None:
    # LoadGen's summary prints rates with 2 decimals, latencies in ns; report.md ms with 2 decimals
    if server:
        assert _num(_table_value(md, "output tokens/s")) == float(
            summary_field(log_dir, "Completed tokens per second")
        )
        assert _num(_table_value(md, "samples/s")) == float(
            summary_field(log_dir, "Completed samples per second")
        )
        for metric, field in (
            ("TTFT p99 (ms)", "99.00 percentile first token latency (ns)"),
            ("TPOT p99 (ms)", "99.00 percentile time to output token (ns)"),
            ("TTFT p50 (ms)", "50.00 percentile first token latency (ns)"),
        ):
            assert abs(_num(_table_value(md, metric)) - int(summary_field(log_dir, field)) / 1e6) <= 0.005
    else:
        assert _num(_table_value(md, "output tokens/s")) == pytest.approx(
            float(summary_field(log_dir, "Tokens per second")), abs=0.005
        )
        assert _num(_table_value(md, "samples/s")) == pytest.approx(
            float(summary_field(log_dir, "Samples per second")), abs=0.005
        )
    verdict = summary_field(log_dir, "Result is")
    assert f"Verdict: **{verdict}**" in md


def test_run_mlperf_report_flag_writes_readable_pngs_and_the_summary(runs):
    folder = runs["fast"] / "report"
    _check_pngs(folder)
    md = (folder / "report.md").read_text()
    for name in PNGS:
        assert f"]({name})" in md
    _assert_numbers_equal_summary(runs["fast"], md, server=True)
    assert "limit / note" in md and "p99 <= 3,000.0 ms" in md  # gpt-oss-120b Server TTFT limit
    if summary_field(runs["fast"], "Result is") == "INVALID":
        assert "early stopping" in md and "Early stopping satisfied: NO" in md


def test_tiny_model_offline_report(runs, tmp_path):
    assert report_main([str(runs["tiny"]), "--out", str(tmp_path)]) == 0
    _check_pngs(tmp_path)
    md = (tmp_path / "report.md").read_text()
    _assert_numbers_equal_summary(runs["tiny"], md, server=False)
    assert "Offline: no latency limit" not in md  # a caption is in the PNG, not the markdown
    assert "| failed queries | 0 |" in md


def test_two_runs_overlaid_with_exact_ratios(runs, tmp_path):
    path = make_report([runs["fast"], runs["slow"]], tmp_path, labels=["fast", "slow"])
    _check_pngs(tmp_path)
    md = path.read_text()
    rows = {row.metric.name: row for row in compare(load_runs([runs["fast"], runs["slow"]]))}
    for name, row in rows.items():
        base, other = row.values
        if base is None or other is None or base == 0:
            assert row.ratios[1] is None
            continue
        assert row.ratios == (1.0, other / base)  # exact, not rounded
        line = next(line for line in md.splitlines() if line.startswith(f"| {name} |"))
        assert f"({other / base:.3f}x)" in line
    tokens = rows["output tokens/s"].values
    assert tokens[0] == float(summary_field(runs["fast"], "Completed tokens per second"))
    assert tokens[1] == float(summary_field(runs["slow"], "Completed tokens per second"))
    assert "| metric | fast | slow |" in md and "### fast" in md and "### slow" in md


def test_report_errors_name_the_directory(runs, tmp_path, capsys):
    assert report_main([str(tmp_path / "nope")]) == 2
    assert "nope is not a run's log directory" in capsys.readouterr().err
    output_dir = runs["fast"].parents[1]
    assert report_main([str(output_dir), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "the run directories under it are" in err and str(runs["fast"]) in err

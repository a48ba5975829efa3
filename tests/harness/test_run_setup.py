"""Mistakes in a run's setup end before LoadGen starts, with exit 2 and one `error:` line, never a
traceback: flags, server URLs, output directories, prompts longer than the backend's context. And a
run never mixes its files with an earlier run's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.runkit import run_cli, run_json

ROOT = Path(__file__).resolve().parents[2]
FAKE_RUN = ROOT / "tests" / "harness" / "fake_run.py"


def fake_run(args: list, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MLPERF_BACKEND"}
    return subprocess.run(
        [sys.executable, str(FAKE_RUN), "--backend", "fake", *map(str, args)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def error_lines(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("error:")]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--target-qps", "inf"], "error: argument --target-qps: expected a finite number, got 'inf'"),
        (["--target-qps", "1e400"], "error: argument --target-qps: expected a finite number, got '1e400'"),
        (["--min-duration", "nan"], "error: argument --min-duration: expected a finite number, got 'nan'"),
        (
            ["--server-url", "not-a-url"],
            "error: --server-url 'not-a-url' is not an http(s) URL; give http://HOST:PORT",
        ),
        (["--fake-delay", "inf"], "error: argument --fake-delay: expected a finite number, got 'inf'"),
    ],
)
def test_bad_flags_exit_2_before_anything_is_written(tmp_path, args, message):
    done = fake_run([*args, "--output-dir", tmp_path / "out"])
    assert done.returncode == 2, done.stdout + done.stderr
    assert error_lines(done) == [message] and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_an_output_dir_that_is_a_file_or_cannot_be_written(tmp_path):
    file = tmp_path / "results"
    file.write_text("not a directory")
    done = fake_run(["--output-dir", file])
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert error_lines(done) == [
        f"error: --output-dir {file}: {file} is a file, not a directory; choose another --output-dir"
    ]
    done = fake_run(["--output-dir", "/proc/gptoss-mlperf-out"])  # even root cannot make a directory there
    assert done.returncode == 2 and "Traceback" not in done.stderr
    (line,) = error_lines(done)
    assert line.startswith("error: --output-dir /proc/gptoss-mlperf-out: cannot write to ") and line.endswith(
        "; choose another --output-dir"
    )


def test_a_second_run_deletes_the_files_of_the_first_and_says_which(fake_backend, tmp_path, capsys):
    log_dir = tmp_path / "offline" / "performance"
    assert run_cli(["--backend", "fake", "--output-dir", tmp_path]) == 0
    first = run_json(log_dir)["started_at"], (log_dir / "mlperf_log_detail.txt").read_text()
    (log_dir / "accuracy.json").write_text("{}")  # as an earlier accuracy scoring would leave
    (log_dir / "my_notes.txt").write_text("mine")  # not ours: kept
    (log_dir / "report").mkdir()  # as --report would leave
    capsys.readouterr()
    assert run_cli(["--backend", "fake", "--output-dir", tmp_path]) == 0
    out = capsys.readouterr().out
    assert (
        f"note: {log_dir} held a previous run's files; deleted them: mlperf_log_summary.txt, "
        "mlperf_log_detail.txt, mlperf_log_accuracy.json, mlperf_log_trace.json, run.json, accuracy.json, "
        "queries.parquet, report/" in out
    )
    assert not (log_dir / "accuracy.json").exists() and (log_dir / "my_notes.txt").read_text() == "mine"
    assert not (log_dir / "report").exists()
    record = run_json(log_dir)
    assert record["cleared_previous_run"][-2:] == ["queries.parquet", "report/"]
    assert (record["started_at"], (log_dir / "mlperf_log_detail.txt").read_text()) != first


def test_prompts_longer_than_the_backends_context_fail_before_loadgen(tmp_path):
    """The backend's own max_model_len (known once started) is checked against every prompt."""
    done = fake_run(["--max-model-len", 150, "--output-dir", tmp_path])
    assert done.returncode == 2 and "Traceback" not in done.stderr
    (line,) = error_lines(done)
    assert "longer than the model's context of 150 tokens" in line and line.startswith(
        "error: sample.parquet: row "
    )
    log_dir = tmp_path / "offline" / "performance"
    assert not (log_dir / "mlperf_log_summary.txt").exists()  # LoadGen never started
    assert run_json(log_dir)["status"] == "error"

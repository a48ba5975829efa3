"""The harness's calls into the evaluation package (written elsewhere): evaluate_run after an
accuracy run, and the compliance audit.config + verify. A stand-in package records the calls;
LoadGen really reads the audit.config it writes."""

from __future__ import annotations

import importlib
import json
import sys
import types
from pathlib import Path

import pytest

from harness.runner import EXIT_COMPLIANCE
from tests.harness.runkit import accuracy_entries, run_cli, run_json


@pytest.fixture
def evaluation(monkeypatch):
    calls: list[tuple] = []
    pkg = types.ModuleType("evaluation")
    compliance = types.ModuleType("evaluation.compliance")

    def evaluate_run(accuracy_log: Path, dataset: Path, output_json: Path) -> dict:
        calls.append(("evaluate_run", accuracy_log, dataset, output_json))
        result = {
            "exact_match": 0.0,
            "entries": len(json.loads(accuracy_log.read_text())),
            "passed": pkg.passes,
        }
        output_json.write_text(json.dumps(result))
        return result

    def write_audit_config(test: str, directory: Path) -> Path:
        calls.append(("write_audit_config", test, directory))
        path = directory / "audit.config"
        # TEST07-style: log every sample's output in performance mode
        path.write_text(
            "*.*.accuracy_log_sampling_target = 100000\n*.*.accuracy_log_rng_seed = 720381539243781796\n"
        )
        return path

    def verify(test: str, output_dir: Path, *, dataset: Path) -> bool:
        calls.append(("verify", test, output_dir, dataset))
        return compliance.passes

    pkg.evaluate_run, pkg.passes = evaluate_run, True
    compliance.write_audit_config, compliance.verify, compliance.passes = write_audit_config, verify, True
    pkg.compliance = compliance
    real = importlib.import_module("evaluation")  # its error classes stay importable through the stand-in
    pkg.__path__ = real.__path__
    monkeypatch.setitem(sys.modules, "evaluation", pkg)
    monkeypatch.setitem(sys.modules, "evaluation.compliance", compliance)
    return types.SimpleNamespace(calls=calls, compliance=compliance, pkg=pkg)


@pytest.mark.parametrize("passes, code", [(True, 0), (False, 1)])
def test_accuracy_run_calls_evaluate_run_and_exits_as_python_m_evaluation(
    fake_backend, evaluation, synth_parquet, tmp_path, passes, code
):
    """One outcome, one exit code: accuracy FAIL exits 1, as `python -m evaluation` does on the same log."""
    evaluation.pkg.passes = passes
    assert (
        run_cli(["--backend", "fake", "--input-file", synth_parquet, "--accuracy", "--output-dir", tmp_path])
        == code
    )
    log_dir = tmp_path / "offline" / "accuracy"
    assert evaluation.calls == [
        ("evaluate_run", log_dir / "mlperf_log_accuracy.json", synth_parquet, log_dir / "accuracy.json")
    ]
    record = run_json(log_dir)
    assert record["evaluation"] == {"exact_match": 0.0, "entries": 16, "passed": passes}
    assert record["exit_code"] == code


def test_an_accuracy_log_that_cannot_be_scored_exits_2_with_one_error_line(
    fake_backend, evaluation, synth_parquet, tmp_path, capsys
):
    from evaluation.accuracy_log import AccuracyLogError

    def broken(accuracy_log: Path, dataset: Path, output_json: Path) -> dict:
        raise AccuracyLogError(f"{accuracy_log}: entry 3 is not an object")

    evaluation.pkg.evaluate_run = broken
    args = ["--backend", "fake", "--input-file", synth_parquet, "--accuracy", "--output-dir", tmp_path]
    assert run_cli(args) == 2
    assert "error: accuracy not scored: " in capsys.readouterr().out
    assert run_json(tmp_path / "offline" / "accuracy")["status"] == "finished"


@pytest.mark.parametrize("passes, code", [(True, 0), (False, EXIT_COMPLIANCE)])
def test_compliance_writes_the_audit_config_loadgen_applies_and_verifies(
    fake_backend, evaluation, synth_no_lens, tmp_path, capsys, passes, code
):
    evaluation.compliance.passes = passes
    assert (
        run_cli(
            [
                "--backend",
                "fake",
                "--input-file",
                synth_no_lens,
                "--output-dir",
                tmp_path,
                "--compliance",
                "TEST07",
                "--min-duration",
                0,
                "--min-query-count",
                24,
            ]
        )
        == code
    )
    log_dir = tmp_path / "offline" / "TEST07"
    # TEST07 grades the run's outputs: verify gets the dataset the run used
    assert evaluation.calls == [
        ("write_audit_config", "TEST07", log_dir),
        ("verify", "TEST07", log_dir, synth_no_lens),
    ]
    # a performance-mode run whose accuracy log holds every sample: LoadGen read the audit.config
    assert len(accuracy_entries(log_dir)) == 24
    assert "Found Audit Config file" in (log_dir / "mlperf_log_detail.txt").read_text()
    assert run_json(log_dir)["compliance"] == {"test": "TEST07", "passed": passes}
    assert ("PASS" if passes else "FAIL") in capsys.readouterr().out


def test_compliance_refuses_accuracy_mode(fake_backend, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        run_cli(["--backend", "fake", "--compliance", "TEST09", "--accuracy", "--output-dir", tmp_path])
    assert e.value.code == 2
    assert "--compliance runs in performance mode; drop --accuracy" in capsys.readouterr().err

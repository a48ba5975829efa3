"""python -m harness.submission on real short runs (the fake backend answering GPQA right): the tree
holds every file the MLPerf layout asks for, and a missing, INVALID or failed piece is refused by name."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from harness.submission import SubmissionError, build_submission
from harness.submission.__main__ import main as submission_main
from harness.submission.sysinfo import REQUIRED_FIELDS
from harness.submission.tree import UNTRUNCATED_DIR, sha256
from tests.harness.oraclekit import fake_with_oracle, run_piece, run_submission_pieces, write_gpqa

pytestmark = pytest.mark.timeout(300)

SCENARIO_FILES = (
    "performance/run_1/mlperf_log_summary.txt",
    "performance/run_1/mlperf_log_detail.txt",
    "accuracy/mlperf_log_summary.txt",
    "accuracy/mlperf_log_detail.txt",
    "accuracy/mlperf_log_accuracy.json",
    "accuracy/accuracy.txt",
    "TEST07/verify_accuracy.txt",
    "TEST07/accuracy/mlperf_log_accuracy.json",
    "TEST07/accuracy/accuracy.txt",
    "TEST07/performance/run_1/mlperf_log_summary.txt",
    "TEST07/performance/run_1/mlperf_log_detail.txt",
    "TEST09/verify_output_len.txt",
    "TEST09/accuracy/mlperf_log_accuracy.json",
    "TEST09/accuracy/accuracy.txt",
    "TEST09/performance/run_1/mlperf_log_summary.txt",
    "TEST09/performance/run_1/mlperf_log_detail.txt",
    "user.conf",
    "measurements.json",
    "README.md",
)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_gpqa(tmp_path_factory.mktemp("gpqa") / "gpqa.parquet")


@pytest.fixture(scope="module")
def good_runs(tmp_path_factory, data) -> Path:
    """Offline + Server: performance, accuracy, TEST07, TEST09, every one passing."""
    with fake_with_oracle():
        return run_submission_pieces(tmp_path_factory.mktemp("runs") / "out", data)


def _build(runs: Path, out: Path, division: str = "closed"):
    return build_submission([runs], out, submitter="Acme", system="cpu_tiny", division=division)


def test_tree_holds_every_required_file(good_runs, tmp_path):
    built = _build(good_runs, tmp_path / "sub")
    root = tmp_path / "sub" / "closed" / "Acme"
    assert built.root == root
    for scenario in ("Offline", "Server"):
        base = root / "results" / "cpu_tiny" / "gpt-oss-120b" / scenario
        for name in SCENARIO_FILES:
            assert (base / name).is_file() and (base / name).stat().st_size > 0, f"{scenario}/{name}"
        # accuracy.txt: what the checker parses, with the hash of the full log kept beside the tree
        text = (base / "accuracy" / "accuracy.txt").read_text()
        assert re.search(r"^'exact_match': 100\.000$", text, re.MULTILINE)
        full = tmp_path / "sub" / UNTRUNCATED_DIR / base.relative_to(tmp_path / "sub") / "accuracy"
        assert f"hash={sha256(full / 'mlperf_log_accuracy.json')}\n" in text
        for log in (base / "accuracy", base / "TEST07" / "accuracy", base / "TEST09" / "accuracy"):
            assert (log / "mlperf_log_accuracy.json").stat().st_size <= 10 * 1024  # the checker's limit
        assert "TEST PASS" in (base / "TEST07" / "verify_accuracy.txt").read_text()
        assert "TEST PASS" in (base / "TEST09" / "verify_output_len.txt").read_text()
        measurements = json.loads((base / "measurements.json").read_text())
        assert all(
            measurements[k]
            for k in (
                "input_data_types",
                "retraining",
                "starting_weights_filename",
                "weight_data_types",
                "weight_transformations",
            )
        )
        assert "--compliance TEST07" in (base / "README.md").read_text()
    server_conf = (root / "results/cpu_tiny/gpt-oss-120b/Server/user.conf").read_text()
    assert "gpt-oss-120b.Server.target_qps = 1000" in server_conf
    system = json.loads((root / "systems" / "cpu_tiny.json").read_text())
    assert set(REQUIRED_FIELDS) <= set(system)
    assert (system["division"], system["submitter"], system["system_type"]) == (
        "closed",
        "Acme",
        "datacenter",
    )
    assert system["host_processor_model_name"] and system["host_memory_capacity"].endswith("GB")
    assert "status" in built.to_fill and "cooling" in built.to_fill  # no machine can tell these
    assert all(not system[k] or system[k] == 0 for k in built.to_fill)
    src = (root / "src" / "gpt-oss-120b" / "README.md").read_text()
    assert "commit" in src and "gptoss-mlperf" in src
    todo = built.todo.read_text()
    assert "`status`" in todo and "min_duration 0 s < 600 s" in todo


def test_open_division_needs_no_compliance_runs(good_runs, tmp_path):
    runs = shutil.copytree(good_runs, tmp_path / "runs")
    for scenario in ("offline", "server"):
        for test in ("TEST07", "TEST09"):
            shutil.rmtree(runs / scenario / test)
    built = _build(runs, tmp_path / "sub", division="open")
    assert not (built.root / "results/cpu_tiny/gpt-oss-120b/Offline/TEST07").exists()
    with pytest.raises(SubmissionError, match=r"Offline TEST07: missing"):
        _build(runs, tmp_path / "sub2")


def _without(runs: Path, *parts: str) -> None:
    shutil.rmtree(runs.joinpath(*parts))


# (what is wrong, how to make it, the message that must name it)
CASES = {
    "server performance INVALID": (
        lambda runs, data: run_piece(runs, "server", "performance", data, "--min-query-count", 40),
        r"Server performance \(.*server/performance\): LoadGen says INVALID",
    ),
    "offline accuracy missing": (
        lambda runs, data: _without(runs, "offline", "accuracy"),
        r"Offline accuracy: missing",
    ),
    "offline accuracy failed": ("plain", r"Offline accuracy \(.*\): accuracy FAIL: exact_match 0\.000"),
    "server TEST09 missing": (
        lambda runs, data: _without(runs, "server", "TEST09"),
        r"Server TEST09: missing",
    ),
    "offline TEST07 failed": ("plain", r"Offline TEST07 \(.*offline/TEST07\): TEST07 FAILED"),
    "failed queries": (
        lambda runs, data: run_piece(runs, "offline", "performance", data, "--fake-fail-every", 4),
        r"Offline performance \(.*\): (\d+) queries failed \(\1 x InjectedFailure: injected failure",
    ),
    "no offline": (
        lambda runs, data: _without(runs, "offline"),
        r"closed division: gpt-oss-120b needs an Offline",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_missing_invalid_or_failed_piece_is_refused_by_name(good_runs, data, tmp_path, case):
    runs = shutil.copytree(good_runs, tmp_path / "runs")
    make, pattern = CASES[case]
    if make == "plain":  # the plain fake's tokens answer nothing: accuracy and TEST07 fail
        mode = "accuracy" if "accuracy" in case else "TEST07"
        with fake_with_oracle(oracle=False):
            assert run_piece(runs, "offline", mode, data) != 0
    else:
        with fake_with_oracle():
            make(runs, data)
    with pytest.raises(SubmissionError, match=pattern) as info:
        _build(runs, tmp_path / "sub")
    assert str(info.value).startswith("refused:")
    assert not (tmp_path / "sub").exists()  # nothing half-written


def test_cli_refusal_exit_code_and_checker_verdict(good_runs, tmp_path, capsys):
    args = ["--runs", str(good_runs), "--submitter", "Acme", "--system", "cpu_tiny", "--division", "closed"]
    runs = shutil.copytree(good_runs, tmp_path / "runs")
    _without(runs, "server", "accuracy")
    assert submission_main([*args[:1], str(runs), *args[2:], "--out", str(tmp_path / "bad")]) == 1
    assert "Server accuracy: missing" in capsys.readouterr().err
    # a stand-in checkout whose checker records its arguments and ends as the real one does
    checker = tmp_path / "inference" / "tools" / "submission" / "submission_checker"
    checker.mkdir(parents=True)
    (checker / "__init__.py").write_text("")
    (checker / "main.py").write_text(
        "import json, pathlib, sys\n"
        "pathlib.Path(__file__).with_name('argv.json').write_text(json.dumps(sys.argv[1:]))\n"
        "print('[x main.py:236 ERROR] NoResults some/path', file=sys.stderr)\n"
        "print('[x main.py:361 ERROR] SUMMARY: submission has errors', file=sys.stderr)\n"
        "sys.exit(1)\n"
    )
    out = tmp_path / "sub"
    assert submission_main([*args, "--out", str(out), "--checker", str(tmp_path / "inference")]) == 4
    text = capsys.readouterr().out
    assert "checker: [x main.py:236 ERROR] NoResults some/path" in text
    assert "submission_checker v6.1: [x main.py:361 ERROR] SUMMARY: submission has errors" in text
    argv = json.loads((checker / "argv.json").read_text())
    assert argv[:6] == ["--input", str(out.resolve()), "--version", "v6.1", "--submitter", "Acme"]
    assert submission_main([*args, "--out", str(out)]) == 1  # not over an existing tree ...
    assert submission_main([*args, "--out", str(out), "--overwrite"]) == 0  # ... unless asked
    assert submission_main([*args, "--out", str(tmp_path / "s3"), "--checker", str(tmp_path)]) == 2


def test_unreadable_system_files_are_reported_not_hidden(monkeypatch, caplog):
    from harness.submission import sysinfo

    real = Path.read_text

    def no_proc(self, *a, **kw):
        if str(self) in ("/proc/meminfo", "/etc/os-release"):
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *a, **kw)

    monkeypatch.setattr(Path, "read_text", no_proc)
    with caplog.at_level("WARNING", logger="harness.submission.sysinfo"):
        assert sysinfo._memory_gb() is None
        assert sysinfo._os_name() == sysinfo.platform.platform()
    assert [r.getMessage() for r in caplog.records] == [
        "host memory unknown: [Errno 13] Permission denied: '/proc/meminfo'",
        "no /etc/os-release ([Errno 13] Permission denied: '/etc/os-release'): "
        "the operating system named by platform.platform()",
    ]


def test_a_failing_nvidia_smi_leaves_the_accelerators_to_fill_and_says_so(monkeypatch, caplog, tmp_path):
    """nvidia-smi there but failing is unknown accelerators, not a CPU-only system ("N/A")."""
    from harness.submission import sysinfo

    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with caplog.at_level("WARNING", logger="harness.submission.sysinfo"):
        desc = sysinfo.describe_system(
            division="closed", submitter="Acme", system="s", packages={}, backend=None
        )
    assert [r.getMessage() for r in caplog.records if "nvidia-smi" in r.getMessage()] == [
        f"nvidia-smi failed (Command '['{smi.name}', '--query-gpu=name,memory.total,driver_version', "
        "'--format=csv,noheader,nounits']' returned non-zero exit status 9.): "
        "the accelerator fields are left to fill"
    ]
    for key in ("accelerators_per_node", "accelerator_model_name", "accelerator_memory_capacity"):
        assert desc.fields[key] == ""
        assert key in desc.to_fill

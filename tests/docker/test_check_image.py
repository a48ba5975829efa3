"""docker/check_image.py, the build-time guard, run against this machine's real environment."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from tests.docker.docker_fakes import REPO

SCRIPT = REPO / "docker" / "check_image.py"
spec = importlib.util.spec_from_file_location("check_image", SCRIPT)
check_image = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_image)


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], check=False, capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory) -> tuple[dict[str, str], object]:
    proc = run("snapshot")
    assert proc.returncode == 0, proc.stderr
    path = tmp_path_factory.mktemp("snap") / "before.json"
    path.write_text(proc.stdout)
    return json.loads(proc.stdout), path


def test_snapshot_lists_the_installed_distributions(snapshot):
    dists, _ = snapshot
    assert dists["pytest"] == pytest.__version__
    assert dists["mlcommons-loadgen"] == "6.0.17"


def test_verify_passes_when_nothing_moved(snapshot):
    _, path = snapshot
    proc = run(
        "verify", "--before", str(path), "--expect", "mlcommons-loadgen==6.0.17", "--import", "mlperf_loadgen"
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "check_image: ok (1 pins, 1 imports)\n", "")


def test_verify_fails_when_setup_moved_the_engine(snapshot, tmp_path):
    dists, _ = snapshot
    before = dict(dists, pytest="1.0.0")
    del before["pandas"]
    before_path = tmp_path / "before.json"
    before_path.write_text(json.dumps(before))
    proc = run("verify", "--before", str(before_path))
    assert proc.returncode == 0  # pytest is not frozen: a note, not an error
    assert f"check_image: setup.sh installed pytest 1.0.0 -> {pytest.__version__}\n" in proc.stdout
    assert f"check_image: setup.sh installed pandas (absent) -> {dists['pandas']}\n" in proc.stdout

    before_path.write_text(json.dumps(dict(dists, torch="2.11.0+cu130")))
    proc = run("verify", "--before", str(before_path))
    assert proc.returncode == 1
    assert proc.stderr == (
        f"check_image: ERROR: setup.sh changed the base image's torch 2.11.0+cu130 -> {dists['torch']}\n"
    )


def test_problems_separates_errors_from_notes():
    before = {"torch": "2.11.0+cu130", "nvidia-cublas": "13.0.1", "numpy": "2.2.6", "vllm": "0.26.0"}
    after = {
        "torch": "2.11.0+cu130",
        "nvidia-cublas": "13.1.0",
        "numpy": "2.3.5",
        "vllm": "0.26.0",
        "orjson": "3.13.0",
    }
    errors, notes = check_image.problems(before, after, {"vllm": "0.26.0", "torch": "2.11.0"}, need_cc=False)
    assert errors == ["setup.sh changed the base image's nvidia-cublas 13.0.1 -> 13.1.0"]
    assert notes == [
        "setup.sh installed numpy 2.2.6 -> 2.3.5",
        "setup.sh installed orjson (absent) -> 3.13.0",
    ]


def test_expected_versions_must_match_the_release_exactly():
    after = {"torch": "2.11.0+cu130", "sglang": "0.5.16"}
    expect = check_image.parse_expect("torch==2.11 sglang==0.5.16 gptoss_mlperf==0.1.0")
    errors, _ = check_image.problems(after, after, expect, need_cc=False)
    assert errors == [
        "gptoss-mlperf==0.1.0 is expected but not installed",
        "torch==2.11 is expected but 2.11.0+cu130 is installed",
    ]
    with pytest.raises(
        SystemExit, match="check_image: --expect items look like name==version, got 'torch>=2'"
    ):
        check_image.parse_expect("torch>=2")


def test_a_c_compiler_is_required_for_triton(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    errors, _ = check_image.problems({}, {}, {}, need_cc=True)
    assert errors == ["no C compiler (cc, gcc or clang): Triton compiles its launcher with one at run time"]
    (tmp_path / "gcc").write_text("#!/bin/sh\n")
    (tmp_path / "gcc").chmod(0o755)
    assert check_image.problems({}, {}, {}, need_cc=True) == ([], [])


def test_imports_that_fail_are_named():
    assert check_image.check_imports(["json", "no_such_module_xyz"]) == [
        "import no_such_module_xyz failed: ModuleNotFoundError: No module named 'no_such_module_xyz'"
    ]


def test_a_module_that_two_distributions_install_is_reported():
    owned = {
        "openai-harmony": {"openai_harmony/__init__.py", "openai_harmony/openai_harmony.abi3.so"},
        "oss-harmony": {"openai_harmony/__init__.py", "openai_harmony/openai_harmony.abi3.so"},
        "opentelemetry-api": {"opentelemetry/trace/__init__.py"},
        "opentelemetry-sdk": {"opentelemetry/sdk/__init__.py"},  # a namespace package shares no file
    }
    assert check_image.overwritten(owned, {"oss-harmony", "opentelemetry-sdk"}) == [
        "setup.sh's oss-harmony overwrote 2 files of openai-harmony, e.g. openai_harmony/__init__.py"
    ]


def test_owned_files_reads_the_real_records():
    owned = check_image.owned_files()
    assert any(p.startswith("mlperf_loadgen.") and p.endswith(".so") for p in owned["mlcommons-loadgen"])
    assert "openai_harmony/__init__.py" in owned["oss-harmony"]

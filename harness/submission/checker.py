"""Run the official submission checker (tools/submission/submission_checker in an mlcommons/inference
checkout) on a built tree and return its verdict."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

DEFAULT_VERSION = "v6.1"  # its seeds are those of the mlperf.conf in LoadGen 6.0.17 (v6.0 lists others)


@dataclass(frozen=True, slots=True)
class CheckerVerdict:
    ok: bool
    returncode: int
    errors: tuple[str, ...]  # the checker's ERROR lines
    summary: str  # its "SUMMARY: ..." line
    output: str


def checker_dir(checkout: Path) -> Path:
    path = Path(checkout) / "tools" / "submission"
    if not (path / "submission_checker" / "main.py").is_file():
        raise FileNotFoundError(
            f"--checker {checkout}: no tools/submission/submission_checker/main.py there; give the root of "
            "an mlcommons/inference checkout"
        )
    return path


def run_checker(
    checkout: Path, submission: Path, *, submitter: str, version: str = DEFAULT_VERSION, extra: list[str] = ()
) -> CheckerVerdict:
    tools = checker_dir(checkout)
    cmd = [
        sys.executable,
        "-m",
        "submission_checker.main",
        "--input",
        str(Path(submission).resolve()),
        "--version",
        version,
        "--submitter",
        submitter,
        "--csv",
        str((Path(submission) / "checker_summary.csv").resolve()),
        *extra,
    ]
    env = dict(os.environ, PYTHONPATH=str(tools) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(cmd, cwd=tools, env=env, capture_output=True, text=True, check=False)
    output = done.stdout + done.stderr
    errors = tuple(line for line in output.splitlines() if ":ERROR:" in line or " ERROR]" in line)
    summary = next((line for line in output.splitlines() if "SUMMARY:" in line), "")
    return CheckerVerdict(done.returncode == 0, done.returncode, errors, summary.strip(), output)

"""build_submission: find and check the runs, then write the tree and its to-do list."""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from harness.git_info import git_line
from harness.submission.pieces import SubmissionError, check, collect, official_gaps
from harness.submission.sysinfo import describe_system
from harness.submission.tree import UNTRUNCATED_DIR, write_tree

log = logging.getLogger(__name__)

TODO_FILE = "SUBMISSION_TODO.md"
DIVISIONS = ("closed", "open")


@dataclass(frozen=True, slots=True)
class Built:
    root: Path  # <out>/<division>/<submitter>
    system_json: Path
    to_fill: tuple[str, ...]  # systems/<system>.json fields the user must fill
    warnings: tuple[str, ...]  # what the official checker will reject (short settings ...)
    todo: Path


def _git_remote(commit_dir: Path) -> str | None:
    """The checkout's "origin" URL; none, quietly, without that remote or outside a checkout."""
    return git_line(
        commit_dir,
        ["remote", "get-url", "origin"],
        ("No such remote", "not a git repository"),
        log,
        "submission: the code's git remote",
    )


def _prepare_out(out: Path, overwrite: bool) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        if not (overwrite and (out / TODO_FILE).is_file()):
            raise SubmissionError(
                f"--out {out} exists and is not empty; choose another, or pass --overwrite to replace a tree "
                "this command wrote there"
            )
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


def build_submission(
    output_dirs: list[Path],
    out: Path,
    *,
    submitter: str,
    system: str,
    division: str,
    overwrite: bool = False,
) -> Built:
    if division not in DIVISIONS:
        raise SubmissionError(f"--division {division!r}: choose closed or open")
    for name, value in (("--submitter", submitter), ("--system", system)):
        if not value or "/" in value or value.startswith("."):
            raise SubmissionError(f"{name} {value!r}: give a name without '/' (it becomes a directory)")
    found = collect(output_dirs)
    problems = check(found, division)
    if problems:
        raise SubmissionError(
            "refused: the submission needs every piece present and passing:\n  - " + "\n  - ".join(problems)
        )
    out = Path(out)
    _prepare_out(out, overwrite)
    first = next(iter(found.values())).runs["performance"].record
    packages = first.get("packages", {})
    commit = first.get("git_commit")
    sysdesc = describe_system(
        division=division,
        submitter=submitter,
        system=system,
        packages=packages,
        backend=first.get("config", {}).get("backend"),
    )
    root = write_tree(
        found,
        out,
        division=division,
        submitter=submitter,
        system=system,
        system_json=sysdesc.fields,
        commit=commit,
        remote=_git_remote(Path(__file__).resolve().parents[2]),
        packages=packages,
    )
    warnings = tuple(official_gaps(found))
    system_json = root / "systems" / f"{system}.json"
    todo = out / TODO_FILE
    todo.write_text(_todo(system_json, sysdesc.to_fill, sysdesc.to_check, warnings, out))
    return Built(root, system_json, sysdesc.to_fill, warnings, todo)


def _todo(system_json: Path, to_fill, to_check, warnings, out: Path) -> str:
    lines = ["# Before submitting", "", f"Fill these fields of `{system_json}` (the checker needs them):", ""]
    lines += [f"- `{k}`" for k in to_fill] or ["- (none)"]
    lines += ["", "Check these, guessed from the machine that built the tree:", ""]
    lines += [f"- `{k}`" for k in to_check]
    lines += ["", "The official checker will reject these runs' settings (fine for a trial tree):", ""]
    lines += [f"- {w}" for w in warnings] or ["- (none found)"]
    lines += [
        "",
        f"The full accuracy logs are in `{out / UNTRUNCATED_DIR}` (the tree holds them truncated, as "
        "truncate_accuracy_log.py does); keep them, and leave them out of the upload.",
        "",
        "Check the tree with the official checker (an mlcommons/inference checkout):",
        "",
        "```bash",
        f"python -m harness.submission ... --checker PATH   # or: cd PATH/tools/submission && "
        f"python -m submission_checker.main --input {out} --version v6.1",
        "```",
        "",
    ]
    return "\n".join(lines)

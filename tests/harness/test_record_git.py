"""run.json's git commit: a checkout gives its HEAD, a tree outside git gives none quietly, and a git
that cannot run (missing, hung) or refuses the repository gives none and says so."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest

from harness import git_info, record

REPO = Path(__file__).resolve().parents[2]


def test_a_checkout_gives_its_head():
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("the tests run outside a git checkout")
    assert record.git_commit(REPO) == head.stdout.strip()


def test_a_tree_outside_git_gives_none_quietly(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="harness.record"):
        assert record.git_commit(tmp_path) is None
    assert caplog.records == []


@pytest.mark.parametrize(
    "error",
    [FileNotFoundError(2, "No such file or directory", "git"), subprocess.TimeoutExpired(["git"], 5)],
    ids=["missing", "hung"],
)
def test_a_git_that_cannot_run_gives_none_and_says_so(monkeypatch, caplog, error):
    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(git_info.subprocess, "run", fail)
    with caplog.at_level(logging.WARNING, logger="harness.record"):
        assert record.git_commit(REPO) is None
    assert [r.getMessage() for r in caplog.records] == [
        f"run.json: the code's git commit is unknown ({type(error).__name__}: {error})"
    ]


def test_a_git_that_refuses_the_repository_gives_none_and_says_so(monkeypatch, caplog):
    def refuse(*args, **kwargs):
        raise subprocess.CalledProcessError(
            128, ["git"], "", "fatal: detected dubious ownership in repository\n"
        )

    monkeypatch.setattr(git_info.subprocess, "run", refuse)
    with caplog.at_level(logging.WARNING, logger="harness.record"):
        assert record.git_commit(REPO) is None
    assert [r.getMessage() for r in caplog.records] == [
        "run.json: the code's git commit could not be read: fatal: detected dubious ownership in repository"
    ]

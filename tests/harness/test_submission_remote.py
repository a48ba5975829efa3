"""harness.submission.build._git_remote: no remote is recorded as none, quietly; git that cannot run
or refuses the repository is recorded as none with a warning naming why (never hidden)."""

from __future__ import annotations

import logging
import subprocess

from harness import git_info
from harness.submission import build


def test_no_origin_remote_is_none_without_a_warning(tmp_path, caplog):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    with caplog.at_level(logging.WARNING):
        assert build._git_remote(tmp_path) is None
    assert caplog.records == []


def test_git_that_cannot_run_is_none_with_a_warning(tmp_path, monkeypatch, caplog):
    def missing(*a, **kw):
        raise FileNotFoundError(2, "No such file or directory", "git")

    monkeypatch.setattr(git_info.subprocess, "run", missing)
    with caplog.at_level(logging.WARNING):
        assert build._git_remote(tmp_path) is None
    assert [r.getMessage() for r in caplog.records] == [
        "submission: the code's git remote is unknown "
        "(FileNotFoundError: [Errno 2] No such file or directory: 'git')"
    ]


def test_git_that_refuses_the_repository_is_none_with_a_warning(tmp_path, monkeypatch, caplog):
    def refuse(*a, **kw):
        raise subprocess.CalledProcessError(
            128, ["git"], "", "fatal: detected dubious ownership in repository\n"
        )

    monkeypatch.setattr(git_info.subprocess, "run", refuse)
    with caplog.at_level(logging.WARNING):
        assert build._git_remote(tmp_path) is None
    assert [r.getMessage() for r in caplog.records] == [
        "submission: the code's git remote could not be read: fatal: detected dubious ownership in repository"
    ]

"""One line that git prints about the code's checkout (its commit, its remote), for the records.

A refusal that only says the answer does not exist (not a checkout, no such remote) is quiet: the
records then hold none. Any other refusal (a repository git will not read, such as another owner's),
a missing git and a hung one also give none, but say why in a warning: never hidden."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path


def git_line(
    root: Path, args: list[str], expected: tuple[str, ...], log: logging.Logger, what: str
) -> str | None:
    """`git -C root *args`'s output, stripped, or None. expected: the stderr phrases of a quiet
    refusal. what: the warning's subject, such as "run.json: the code's git commit"."""
    try:
        done = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=5, check=True
        )
    except subprocess.CalledProcessError as e:
        stderr = (e.stderr or "").strip()
        if not any(phrase in stderr for phrase in expected):
            log.warning("%s could not be read: %s", what, stderr)
        return None
    except (OSError, subprocess.SubprocessError) as e:  # git missing or hung
        log.warning("%s is unknown (%s: %s)", what, type(e).__name__, e)
        return None
    return done.stdout.strip() or None

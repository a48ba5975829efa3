"""The checkpoint the gptoss backend runs when none is given: the tiny random one, made once."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

# Bump when gptoss.tools.make_checkpoint's output changes, so an old cached checkpoint is not reused.
LAYOUT = "tiny-seed0-v1"


def data_dir() -> Path:
    return Path(os.environ.get("MLPERF_DATA_DIR") or Path.home() / ".cache" / "gptoss-mlperf")


def default_checkpoint() -> Path:
    """Path of the tiny MXFP4 checkpoint under $MLPERF_DATA_DIR, written on first use.

    It is written into a temporary directory beside the target and renamed into place, so a
    crash never leaves a half-written checkpoint and concurrent first calls agree on one.
    """
    target = data_dir() / f"gptoss-{LAYOUT}"
    if (target / "config.json").is_file():
        return target
    from gptoss.tools.make_checkpoint import preset_config, write_checkpoint

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        write_checkpoint(preset_config("tiny"), tmp, seed=0)
        try:
            tmp.rename(target)
        except OSError:
            # Another process renamed its copy first (the target is a non-empty directory now).
            if not (target / "config.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return target

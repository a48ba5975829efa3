"""The checkpoint the gptoss backend runs when none is given: the tiny random one, made once."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

# Bump when gptoss.tools.make_checkpoint's output changes, so an old cached checkpoint is not reused.
LAYOUT = "tiny-seed0-v1"

log = logging.getLogger("gptoss.default")


def data_dir() -> Path:
    return Path(os.environ.get("MLPERF_DATA_DIR") or Path.home() / ".cache" / "gptoss-mlperf")


def damage(path: Path) -> str | None:
    """Why the checkpoint at `path` cannot be loaded (an unreadable config.json, a missing or truncated
    safetensors file), or None. Reads only config.json and the safetensors headers."""
    from safetensors import safe_open

    from gptoss.config import ModelConfig

    try:
        ModelConfig.from_json(path)
    except (OSError, ValueError) as e:  # a JSONDecodeError is a ValueError
        return f"config.json: {e}"
    files = sorted(path.glob("*.safetensors"))
    if not files:
        return "no .safetensors file"
    for file in files:
        try:
            with safe_open(file, framework="numpy") as f:
                f.keys()
        except Exception as e:  # noqa: BLE001
            # SafetensorError (truncated, bad header) derives from Exception only
            return f"{file.name}: {e}"
    return None


def default_checkpoint() -> Path:
    """Path of the tiny MXFP4 checkpoint under $MLPERF_DATA_DIR, written on first use.

    It is written into a temporary directory beside the target and renamed into place, so a
    crash never leaves a half-written checkpoint and concurrent first calls agree on one. A cached
    copy damaged since (a truncated file, an edited config.json) is deleted and written again,
    with a warning that says so.
    """
    target = data_dir() / f"gptoss-{LAYOUT}"
    if target.exists():
        reason = damage(target)
        if reason is None:
            return target
        log.warning(
            "the cached default checkpoint %s is damaged (%s); deleting it and writing it again",
            target,
            reason,
        )
        shutil.rmtree(target)
    from gptoss.tools.make_checkpoint import preset_config, write_checkpoint

    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    except OSError as e:
        raise OSError(
            f"cannot write the default checkpoint under {target.parent} ($MLPERF_DATA_DIR): {e}"
        ) from e
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

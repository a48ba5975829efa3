"""Fixtures of the bench tests; the stub binaries and the script runner are in gpu_stubs.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.bench.gpu_stubs import NCU_STUB, PYTHON_STUB


@pytest.fixture
def stubs(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in {
        "python3": PYTHON_STUB,
        "ncu": NCU_STUB,
        "nvidia-smi": "#!/bin/sh\necho 'GPU 0: stub'\n",
    }.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    (home / "vllm_ready").touch()
    (tmp_path / ".wc1").mkdir()
    (tmp_path / ".wc1" / "bench_vllm.py").touch()
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HOME": str(home),
        "REAL_PYTHON": sys.executable,
        "STUB_LOG": str(tmp_path / "calls.log"),
        "CKPT": str(tmp_path / "ck"),
        "VLLM_SCRIPT": str(tmp_path / ".wc1" / "bench_vllm.py"),
    }

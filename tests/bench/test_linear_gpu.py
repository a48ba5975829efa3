"""bench/kernels/linear_gpu.py's variant specs: the label a row prints and the launch it times. A spec
that times another kernel or other tiles than its label says makes the device call's table wrong,
so the parsing is tested here on CPU."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "kernels"))
from linear_gpu import _kernel  # noqa: E402

from gptoss.kernels import gemv_preload as gp  # noqa: E402
from gptoss.kernels import gemv_stream as gs  # noqa: E402


def test_preload_and_stream_specs_name_their_kernel_and_tiles():
    label, fn = _kernel("stream", 5120, 2880)
    assert label == f"stream:{gs.TILE[0]}x{gs.TILE[1]}" and fn.func is gs.gemv_stream
    assert fn.keywords == {"block_n": gs.TILE[0], "num_warps": gs.TILE[1], "per_sm": None}
    label, fn = _kernel("stream:4x8x3", 2880, 4096)
    assert label == "stream:4x8x3" and fn.keywords == {"block_n": 4, "num_warps": 8, "per_sm": 3}
    label, fn = _kernel("preload:8x8", 2880, 4096)
    assert label == "preload:8x8" and fn.func is gp.gemv_preload
    assert fn.keywords == {"block_n": 8, "num_warps": 8}
    label, fn = _kernel("32x256x4x3", 2880, 4096)
    assert label == "32x256x4x3" and fn.keywords == {
        "block_n": 32,
        "block_k": 256,
        "num_warps": 4,
        "num_stages": 3,
    }

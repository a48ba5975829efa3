"""bench/kernels/top_p_gpu.py on CPU (Triton's interpreter, untimed): its tile specs parse or say
why not, and every tile's search keeps what the first tile's keeps on a small batch."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "kernels"))

import top_p_gpu  # noqa: E402

from gptoss.kernels import sampling_top_p  # noqa: E402


def test_tiles_parse_and_bad_ones_say_why():
    assert top_p_gpu.parse_tiles("256x1x4,512x2x8") == [(256, 1, 4), (512, 2, 8)]
    with pytest.raises(argparse.ArgumentTypeError, match="expected BLOCKxUNROLLxWARPS"):
        top_p_gpu.parse_tiles("256x1")
    with pytest.raises(argparse.ArgumentTypeError, match="UNROLL 1 or 2"):
        top_p_gpu.parse_tiles("256x3x4")
    with pytest.raises(argparse.ArgumentTypeError, match="power of two"):
        top_p_gpu.parse_tiles("300x1x4")


def test_each_tile_keeps_what_the_first_keeps(monkeypatch):
    monkeypatch.setattr(top_p_gpu, "timed_us", lambda fn, what: (fn(), 1.0)[1])
    monkeypatch.setattr(sampling_top_p, "PASS_TILE", sampling_top_p.PASS_TILE)  # restored after
    rows = top_p_gpu.batch_rows(3, [(256, 1, 4), (16, 2, 1), (64, 1, 2)], device="cpu", vocab=700)
    assert len(rows) == 4 and "sort (masked copy)" in rows[0]
    assert [r.split()[2] for r in rows[1:]] == ["256x1x4", "16x2x1", "64x1x2"]
    assert all(" 3/3 " in r for r in rows[1:]), rows

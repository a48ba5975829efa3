"""bench/kernels/attn_sweep.py's decode settings and cases from the command line: "+hf" times a
setting in the (KV head, split, sequence) launch order, cases name batch, context, layer kind and
key bound; anything else is refused by name. The sweep itself needs a GPU."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "kernels"))

import attn_sweep  # noqa: E402


def test_decode_settings_take_the_launch_order():
    off = {"FULL_DECODE_BY_GPU": {}}  # a cell times its own setting on every layer, whatever the GPU
    assert attn_sweep.decode_setting("64,2,3") == {"DECODE_CFG": (64, 2, 3), "HEADS_FIRST": False} | off
    assert attn_sweep.decode_setting("32,2,3+hf") == {"DECODE_CFG": (32, 2, 3), "HEADS_FIRST": True} | off
    with pytest.raises(ValueError, match="'64,2,3\\+x': a decode setting is BN,W,S or BN,W,S\\+hf"):
        attn_sweep.decode_setting("64,2,3+x")
    # every default is one of them, the engine's default and its heads-first twin first
    settings = [attn_sweep.decode_setting(c) for c in attn_sweep.CONFIGS]
    assert settings[:2] == [
        {"DECODE_CFG": (64, 2, 3), "HEADS_FIRST": False} | off,
        {"DECODE_CFG": (64, 2, 3), "HEADS_FIRST": True} | off,
    ]
    assert len(set(attn_sweep.CONFIGS)) == len(attn_sweep.CONFIGS)


def test_cases_from_the_command_line():
    assert attn_sweep.parse_case("64:8192:full") == (64, 8192, False, None)
    assert attn_sweep.parse_case("1:640:sliding:8192") == (1, 640, True, 8192)
    for bad in ("64:8192", "64:8k:full", "64:8192:ring", "1:2:full:3:4"):
        with pytest.raises(ValueError, match="a decode case is B:CTX:full\\|sliding\\[:HINT\\]"):
            attn_sweep.parse_case(bad)
    # issue 10's full layers at 8k context, where the H100 had us under FA3 (v72), are swept by default
    assert {(64, 8192, False, None), (256, 8192, False, None)} <= set(attn_sweep.CASES)

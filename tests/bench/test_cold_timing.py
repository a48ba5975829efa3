"""bench/kernels/timing.py's L2 flushes (a read leaves clean lines, a zeroing dirty ones) and
moe_gpu.py's --dec-tiles variants: the engine with other split-K decode tiles, set only while its
graphs are captured."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "kernels"))

import timing  # noqa: E402
from moe_parts import switches  # noqa: E402
from moe_variant import engine_tiles  # noqa: E402

from gptoss.kernels import moe_v3_dec, moe_v3_dec_gu  # noqa: E402
from gptoss.kernels.moe_tiles import DecTiles  # noqa: E402


def test_the_read_flush_reads_every_word_and_writes_none():
    buf = torch.arange(1000, dtype=torch.int32)
    before = buf.clone()
    assert int(timing.l2_flush("read", buf)()) == 999  # the max: every word was read
    assert torch.equal(buf, before)


def test_the_zero_flush_writes_every_word():
    buf = torch.arange(1, 1001, dtype=torch.int32)
    timing.l2_flush("zero", buf)()
    assert int(buf.abs().sum()) == 0


def test_an_unknown_flush_is_refused_by_name():
    with pytest.raises(ValueError, match=r"flush must be one of read, zero, got 'dirty'"):
        timing.l2_flush("dirty", torch.zeros(4, dtype=torch.int32))


def test_the_default_flush_is_the_clean_one():
    assert timing.FLUSH == "read" and timing.FLUSH in timing.FLUSHES


def test_dec_tiles_specs_give_the_engine_with_those_tiles():
    both = engine_tiles("gu:16,32,512,2,2,3+dn:8,64,256,4,4,4,r128")
    assert both.engine and both.kernels == "dual"
    assert both.engine_gate_up == DecTiles(16, 32, 512, 2, 2, 3)
    assert both.engine_down == DecTiles(8, 64, 256, 4, 4, 4, maxnreg=128)
    down_only = engine_tiles("dn:16,32,1024,4,4,3")
    assert down_only.engine_gate_up is None and down_only.engine_down == DecTiles(16, 32, 1024, 4, 4, 3)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("up:16,32,512,2,2,3", "each part is gu:TILES or dn:TILES"),
        ("gu:16,32,512,2,2,3+gu:16,32,256,2,2,4", "each GEMM once"),
        ("dn:16,32,500,4,4,3", "BK of 64 \\* SPLIT"),
        ("gu:16,32,512", "six positive counts"),
    ],
)
def test_bad_dec_tiles_specs_are_refused(spec, message):
    with pytest.raises(ValueError, match=message):
        engine_tiles(spec)


def test_an_engine_tiles_variant_sets_both_tile_sets_only_inside_its_switches():
    saved = (
        moe_v3_dec_gu.V3_GATE_UP_DEC,
        moe_v3_dec_gu.V3_GATE_UP_DEC_BIG,
        moe_v3_dec.V3_DOWN_DEC,
        moe_v3_dec.V3_DOWN_DEC_BIG,
    )
    gu = DecTiles(16, 32, 512, 2, 2, 3)
    with switches(engine_tiles("gu:16,32,512,2,2,3")):
        assert moe_v3_dec_gu.V3_GATE_UP_DEC == gu and moe_v3_dec_gu.V3_GATE_UP_DEC_BIG == gu
        # the down keeps the engine's own two sets
        assert (moe_v3_dec.V3_DOWN_DEC, moe_v3_dec.V3_DOWN_DEC_BIG) == saved[2:]
        assert moe_v3_dec.dec_tiles_v3(16, 2880).bn == saved[3].bn  # 16 tokens: the big set
    assert (
        moe_v3_dec_gu.V3_GATE_UP_DEC,
        moe_v3_dec_gu.V3_GATE_UP_DEC_BIG,
        moe_v3_dec.V3_DOWN_DEC,
        moe_v3_dec.V3_DOWN_DEC_BIG,
    ) == saved
    dn = DecTiles(16, 32, 1024, 4, 4, 3)
    with switches(engine_tiles("dn:16,32,1024,4,4,3")):
        assert moe_v3_dec.dec_tiles_v3(1, 2880).bk == 1024 and moe_v3_dec.dec_tiles_v3(16, 2880).bk == 1024
        assert moe_v3_dec.V3_DOWN_DEC_BIG == dn


def test_cold_us_flushes_before_every_timed_call(monkeypatch):
    log: list[str] = []

    class Event:
        made = 0

        def __init__(self, enable_timing: bool) -> None:
            assert enable_timing
            Event.made += 1
            self.i = Event.made

        def record(self) -> None:
            log.append("start" if self.i % 2 else "end")

        def elapsed_time(self, end: Event) -> float:
            return {1: 0.004, 3: 0.001, 5: 0.002}[self.i]  # ms: the median is the 2 us

    buf = torch.arange(8, dtype=torch.int32)
    monkeypatch.setattr(timing, "_FLUSH_BUF", [buf])
    monkeypatch.setattr(timing, "l2_flush", lambda mode, b: lambda: log.append(f"flush {mode}"))
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: log.append("sync"))
    us = timing.cold_us(lambda: log.append("fn"), flush="zero", reps=3, warmup=2)
    assert us == pytest.approx(2.0)
    assert log == ["fn", "fn", *["flush zero", "start", "fn", "end"] * 3, "sync"]

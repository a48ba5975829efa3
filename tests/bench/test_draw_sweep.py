"""bench/kernels/draw_sweep_gpu.py run small on CPU (Triton's interpreter): every launch shape it sweeps
draws the default launch's ids, a shape that does not is a failed case, and the knobs come back."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "kernels"))

import draw_sweep_gpu  # noqa: E402
import timing  # noqa: E402

from gptoss.kernels import sampling_draw


def _timed(calls: list[str]):
    def time_us(fn, what):
        fn()
        calls.append(what)
        return 2.0 if "default" in what else 1.0

    return time_us


def test_every_swept_launch_draws_the_default_ids(monkeypatch):
    monkeypatch.setattr(timing, "CASE_FAILED", [])
    monkeypatch.setattr(draw_sweep_gpu, "case_failed", lambda what, why: timing.CASE_FAILED.append(what))
    calls: list[str] = []
    # vocab 5000 at B 3: chunks of 2048 (three, the last partial) or 8192 (one: the single-pass launch)
    rows = draw_sweep_gpu.sweep([3], [0, 1], [2048, 8192], [(256, 1), (1024, 4)], 5000, "cpu", _timed(calls))
    assert len(rows) == 2 * 2 * 2 * 2  # float32 and bf16, each variant timed (the default's too)
    assert all(r["same"] for r in rows), [r for r in rows if not r["same"]]
    assert timing.CASE_FAILED == []
    assert calls[0] == "B=3 float32 default" and calls[9] == "B=3 bfloat16 default"
    knobs = (sampling_draw.SCREEN, sampling_draw.SCREEN_FROM, sampling_draw.CHUNK_MAX, sampling_draw._BLOCK)
    assert knobs + (sampling_draw.WARPS,) == (1, 64, 16384, 1024, 4)
    screened = (sampling_draw.SCREEN_CHUNK_MAX, sampling_draw.SCREEN_BLOCK, sampling_draw.SCREEN_WARPS)
    assert screened == (8192, 256, 1)  # put back too
    text = draw_sweep_gpu.table(rows).splitlines()
    assert text[1].split() == ["B=3", "float32", "0", "2048", "256x1", "1.0", "2.0", "2.00", "same"]


def test_a_launch_that_draws_other_ids_is_a_failed_case(monkeypatch):
    monkeypatch.setattr(timing, "CASE_FAILED", [])
    monkeypatch.setattr(draw_sweep_gpu, "case_failed", lambda what, why: timing.CASE_FAILED.append(what))
    real = draw_sweep_gpu.gumbel_argmax

    def off_by_one_unscreened(logits, *args):
        ids = real(logits, *args)
        return ids + 1 if sampling_draw.SCREEN == 0 else ids

    monkeypatch.setattr(draw_sweep_gpu, "gumbel_argmax", off_by_one_unscreened)
    rows = draw_sweep_gpu.sweep([2], [0, 1], [2048], [(1024, 4)], 3000, "cpu", _timed([]))
    assert [(r["screen"], r["same"]) for r in rows] == [(0, False), (1, True)] * 2
    assert timing.CASE_FAILED == [
        "B=2 float32 screen 0 chunk 2048 block 1024x4",
        "B=2 bfloat16 screen 0 chunk 2048 block 1024x4",
    ]
    assert "DIFFER" in draw_sweep_gpu.table(rows)


def test_a_variant_shapes_screened_and_unscreened_launches_alike():
    seen = []
    for screen in (0, 1):
        draw_sweep_gpu.with_knobs(
            (screen, 4096, 512, 2),
            lambda: seen.append([sampling_draw.launch_shape(b, False) for b in (1, 1024)]),
        )
    assert seen == [[(512, 2, 4096)] * 2] * 2
    assert sampling_draw.launch_shape(1024, False) == (256, 1, 8192)  # the defaults put back

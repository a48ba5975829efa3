"""bench/kernels/router_gpu.py run small on CPU (Triton's interpreter): every fused launch shape routes
exactly as route_and_group does on the logits it stored, a launch that does not is a failed case, and
moe_router's knobs come back."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "kernels"))

import router_gpu  # noqa: E402
import timing  # noqa: E402

from gptoss.kernels import moe_router
from tests.gptoss.kernels.moekit import interpreter_like_the_gpu  # noqa: F401 - bf16 dots as the GPU's


def _timed(calls: list[str]):
    def time_us(fn, what):
        fn()
        calls.append(what)
        return 4.0 if "unfused" in what else 2.0

    return time_us


def test_every_launch_shape_routes_as_route_and_group_of_its_logits(monkeypatch):
    monkeypatch.setattr(timing, "CASE_FAILED", [])
    monkeypatch.setattr(router_gpu, "case_failed", lambda what, why: timing.CASE_FAILED.append(what))
    calls: list[str] = []
    rows = router_gpu.sweep([70], [8], [(16, 64, 4, 3), (32, 32, 2, 2)], 96, "cpu", _timed(calls))
    assert calls == ["E=8 T=70 unfused", "E=8 T=70 fused 16x64x4x3", "E=8 T=70 fused 32x32x2x2"]
    assert [r["exact"] for r in rows] == [True, True] and timing.CASE_FAILED == []
    assert all(r["alike"] > 0.9 for r in rows)  # the same logits up to the sum's order
    assert (moe_router.BLOCK_T, moe_router.BLOCK_K, moe_router.WARPS, moe_router.STAGES) == (16, 64, 4, 3)
    line = router_gpu.table(rows)[1].split("|")
    assert [c.strip() for c in line[1:8]] == ["8", "70", "32x32x2x2", "4.0", "2.0", "2.00", "yes"]


def test_a_launch_that_routes_otherwise_is_a_failed_case(monkeypatch):
    monkeypatch.setattr(timing, "CASE_FAILED", [])
    monkeypatch.setattr(router_gpu, "case_failed", lambda what, why: timing.CASE_FAILED.append(what))
    real = moe_router.router_route

    def swapped_weights(*a, **k):
        r = real(*a, **k)
        r.weights.copy_(r.weights.flip(1))
        return r

    monkeypatch.setattr(moe_router, "router_route", swapped_weights)
    rows = router_gpu.sweep([66], [8], [(16, 64, 4, 3)], 64, "cpu", _timed([]))
    assert [r["exact"] for r in rows] == [False]
    assert timing.CASE_FAILED == ["E=8 T=66 fused 16x64x4x3"]
    assert "| NO |" in router_gpu.table(rows)[0]


def test_same_routing_compares_row_lists_as_sets():
    from gptoss.kernels.moe_routing import route_and_group

    logits = torch.randn(70, 8)
    a, b = route_and_group(logits, 4), route_and_group(logits, 4)
    assert router_gpu.same_routing(a, b)
    e = int(a.ids[0, 0])
    b.rows[e, : b.counts[e]] = b.rows[e, : b.counts[e]].flip(0)  # another order: the same list
    assert router_gpu.same_routing(a, b)
    b.rows[e, 0] = -1
    assert not router_gpu.same_routing(a, b)

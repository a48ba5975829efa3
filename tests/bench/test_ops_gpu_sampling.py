"""bench/kernels/ops_gpu.py's sampling rows, run small on CPU (Triton's interpreter): every case runs,
and each row's two timed calls draw the same ids, so a ratio compares the same job done two ways.
(2026-12-05: the "sort blocks" peer passed the masked logits where the cut goes and failed on the GPU,
taking the whole ops part with it.)"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "kernels"))

import ops_gpu  # noqa: E402


def test_every_sampling_case_runs_and_each_rows_pair_draws_the_same_ids(monkeypatch):
    drawn: dict[str, torch.Tensor] = {}

    def timed_us(fn, what):
        drawn[what] = fn()
        return 1.0

    monkeypatch.setattr(ops_gpu, "timed_us", timed_us)
    monkeypatch.setattr(ops_gpu, "share", lambda nbytes, us: 0.0)  # the GPU's name: none here
    torch.manual_seed(0)
    rows = ops_gpu.sample_cases(32, device="cpu", vocab=300)
    assert [r["case"] for r in rows] == [
        "B=32 greedy",
        "B=32 T=1",
        "B=32 T=1 bf16 logits",
        "B=32 T=1 screen 1",
        "B=32 T=1 screen 2",
        "B=32 T=1 top_k=50 top_p=0.9",
        "B=32 T=1 top_k=50 top_p=0.9 cut",
        "B=32 T=1 top_p=0.9",
        "B=32 T=1 top_p=0.9 search",
        "B=32 T=1 top_p=0.9 search cut",
        "B=32 T=1 top_p=0.9 search cut screen 2",
        "B=32 T=1 top_p=0.9 sort blocks",
        "B=32 T=1 top_p=0.9 on 1/16 rows",
    ]
    ids = {k: v.reshape(-1) for k, v in drawn.items()}
    assert torch.equal(ids["B=32 greedy"], ids["B=32 argmax"])
    for group in (
        ("T=1 bf16", "T=1 bf16 widened"),
        ("T=1", "T=1 screen 0", "T=1 screen 1", "T=1 screen 2"),
        ("top-k/p", "top-k/p sort", "top-k/p cut"),
        (
            "top-p",
            "top-p search",
            "top-p search cut",
            "top-p search cut screen 0",
            "top-p search cut screen 2",
        )
        + ("top-p one sort",),
        ("1/16 top-p rows", "1/16 top-p, all rows"),
    ):
        first = ids[f"B=32 {group[0]}"]
        assert first.min() >= 0 and first.max() < 300
        for other in group[1:]:
            assert torch.equal(ids[f"B=32 {other}"], first), other
    # the filters change the draw: a top-p row differs from the unfiltered T=1 draw somewhere
    assert not torch.equal(ids["B=32 top-p"], ids["B=32 T=1"])

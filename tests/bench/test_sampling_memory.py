"""bench/sampling_memory.py: the peak it reads off the profiler is an allocation's size, and the sort
needs more temporaries a logit than the per-row top-k (what sampling.SORT_ROWS is sized from)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from sampling_memory import peak_bytes  # noqa: E402

from gptoss.kernels.sampling_filter import mask_top_k_top_p, mask_within_top_k  # noqa: E402


def test_the_peak_is_what_the_function_holds_at_once():
    def two_then_one():
        a = torch.ones(1000, 1000)  # 4 MB
        b = a + 1  # 8 MB held
        del a
        return b * 2  # 8 MB again at the most

    assert 8_000_000 <= peak_bytes(two_then_one) < 9_000_000


def test_the_sort_holds_more_a_logit_than_the_per_row_top_k():
    b, v = 8, 5000
    x = torch.randn(b, v, generator=torch.Generator().manual_seed(1))
    t, p, k = torch.ones(b), torch.full((b,), 0.9), torch.full((b,), 20, dtype=torch.int32)
    sort = peak_bytes(lambda: mask_top_k_top_p(x, t, k, p)) / (b * v)
    top_k = peak_bytes(lambda: mask_within_top_k(x, t, k, p, 20)) / (b * v)
    assert sort > 2 * top_k > 8  # the masked float32 copy alone is 4 bytes a logit

"""The kernel runner's greedy pick (gptoss.kernel_runner._greedy): first argmax per row, -1 for a
row holding NaN, and on CUDA no [N, V] temporary beside the logits (an fp8 cache's ~1,800-row
batch of 120b ran out of memory on the old NaN mask)."""

from __future__ import annotations

import pytest
import torch

from gptoss.kernel_runner import _greedy


def test_greedy_takes_the_first_maximum_and_fails_rows_holding_nan():
    logits = torch.tensor(
        [
            [0.0, 3.0, 3.0, 1.0],  # a tie: the first
            [float("nan"), 9.0, 0.0, 0.0],  # NaN before the maximum
            [0.0, 9.0, 0.0, float("nan")],  # NaN after it
            [-1.0, -2.0, -0.5, -3.0],
        ]
    )
    assert _greedy(logits).tolist() == [1, -1, -1, 2]
    assert _greedy(logits.to(torch.bfloat16)).tolist() == [1, -1, -1, 2]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="device memory needs CUDA")
def test_greedy_allocates_nothing_of_the_logits_size():
    logits = torch.randn(1800, 201088, device="cuda")
    logits[7, 123] = float("nan")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    ids = _greedy(logits)
    assert ids[7].item() == -1 and (ids[torch.arange(1800, device="cuda") != 7] >= 0).all()
    assert torch.cuda.max_memory_allocated() - base < 1 << 20  # the old mask: 362 MB

"""The GPU benches' greedy agreement (bench/agreement.py): a run that returned nothing must not
count as agreeing (it did, and a failed vLLM LoRA run once printed 100 %)."""

from __future__ import annotations

import pytest

from bench.agreement import position_rate, prefix_rate


def test_prefix_rate_counts_up_to_the_first_difference():
    a = [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert prefix_rate(a, a) == 1.0
    assert prefix_rate(a, [[1, 2, 9, 4], [5, 6, 7, 8]]) == 6 / 8  # the 4 after the difference is not counted
    assert position_rate(a, [[1, 2, 9, 4], [5, 6, 7, 8]]) == 7 / 8


def test_missing_tokens_are_differences():
    a = [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert prefix_rate(a, [[], []]) == 0.0
    assert position_rate(a, [[], []]) == 0.0
    assert prefix_rate(a, [[1, 2], [5, 6, 7, 8]]) == 6 / 8


def test_different_prompt_counts_are_refused():
    with pytest.raises(ValueError, match="2 continuations against 1"):
        prefix_rate([[1], [2]], [[1]])

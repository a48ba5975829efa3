"""Greedy-token agreement of two runs over the same prompts, for the GPU benches' tables."""

from __future__ import annotations


def _common_prefix(x: list[int], y: list[int]) -> int:
    return next((i for i, (u, v) in enumerate(zip(x, y, strict=False)) if u != v), min(len(x), len(y)))


def prefix_rate(a: list[list[int]], b: list[list[int]]) -> float:
    """Share of a's tokens that b matches up to each pair's first difference. A token b lacks (it
    stopped early, failed or returned nothing) is a difference: an empty b scores 0, never 1."""
    if len(a) != len(b):
        raise ValueError(f"agreement of {len(a)} continuations against {len(b)}")
    return sum(_common_prefix(x, y) for x, y in zip(a, b, strict=True)) / max(1, sum(map(len, a)))


def position_rate(a: list[list[int]], b: list[list[int]]) -> float:
    """Share of a's tokens that b has at the same position (later tokens may agree again)."""
    if len(a) != len(b):
        raise ValueError(f"agreement of {len(a)} continuations against {len(b)}")
    same = sum(u == v for x, y in zip(a, b, strict=True) for u, v in zip(x, y, strict=False))
    return same / max(1, sum(map(len, a)))

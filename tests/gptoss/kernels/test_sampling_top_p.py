"""Top-p without a vocabulary sort (gptoss.kernels.sampling_top_p.top_p_cut): the kept set of every row
equals the sort's (sampling_filter.mask_top_k_top_p with top_k 0), ties split by index, whatever the
chunking; sample() with it draws what the sort's masked copy draws.

Interpreter on CPU; `TRITON_INTERPRET=0 pytest tests/gptoss/kernels/test_sampling_top_p.py` on a GPU
runs them compiled, plus the full-vocabulary one.
"""

from __future__ import annotations

import pytest
import torch

from gptoss.kernels import sampling, sampling_filter
from gptoss.kernels.sampling import sample
from gptoss.kernels.sampling_top_p import top_p_cut
from tests.gptoss.kernels.kernelkit import DEV, INTERPRETER_WARNINGS, gpu

pytestmark = INTERPRETER_WARNINGS
INF = float("inf")


def kept_by_cut(logits: torch.Tensor, tau: torch.Tensor, cut: torch.Tensor) -> torch.Tensor:
    idx = torch.arange(logits.shape[1], device=logits.device)[None, :]
    return (logits > tau[:, None]) | ((logits == tau[:, None]) & (idx <= cut[:, None])) | logits.isnan()


def kept_by_sort(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    no_k = torch.zeros(logits.shape[0], dtype=torch.int32, device=logits.device)
    return sampling_filter.mask_top_k_top_p(logits, temperature, no_k, top_p) != -INF


def rows(g: torch.Generator, V: int, ties: str, scale: float, p_lo: float, p_span: float):
    """12 rows: greedy, top_p 1, a NaN, all -inf, -0.0 / +0.0 ties, some -inf, then plain ones."""
    logits = torch.randn(12, V, generator=g) * scale
    if ties == "bf16":  # the lm_head's bf16 values: many logits equal
        logits = logits.bfloat16().float()
    elif ties == "int":
        logits = logits.round()
    temperature = torch.rand(12, generator=g) + 0.3
    temperature[0] = 0.0
    top_p = torch.rand(12, generator=g) * p_span + p_lo
    top_p[1] = 1.0
    logits[2, 7] = float("nan")
    logits[3] = -INF
    logits[4, ::3], logits[4, 1::3] = -0.0, 0.0
    logits[5, : V // 2] = -INF
    return logits.to(DEV), temperature.to(DEV), top_p.to(DEV)


@pytest.mark.parametrize("ties", ["none", "bf16", "int"])
@pytest.mark.parametrize(
    ("scale", "p_lo", "p_span"),
    [(3.0, 0.0, 1.0), (1.0, 0.0, 1.0), (0.3, 0.95, 0.049)],  # peaked rows, flat ones kept almost whole
)
def test_the_search_keeps_what_the_sort_keeps(ties: str, scale: float, p_lo: float, p_span: float) -> None:
    g = torch.Generator().manual_seed(21)
    for V, chunk in ((61, 0), (397, 64), (1500, 256)):  # one chunk; 7 chunks of 64; 6 of 256
        logits, temperature, top_p = rows(g, V, ties, scale, p_lo, p_span)
        tau, cut = top_p_cut(logits, temperature, top_p, chunk=chunk)
        gone = logits == -INF  # cannot be drawn either way
        got, want = kept_by_cut(logits, tau, cut) | gone, kept_by_sort(logits, temperature, top_p) | gone
        assert torch.equal(got, want), (V, (got != want).any(-1).nonzero().flatten().tolist())
        # greedy, top_p 1, NaN and all -inf rows are left whole
        assert tau[:4].tolist() == [-INF] * 4 and cut[:4].tolist() == [V] * 4
        assert int(got[6:].sum(-1).min()) >= 1


def test_a_tie_run_across_chunks_is_cut_by_index() -> None:
    V = 300
    logits = torch.full((1, V), -INF)
    logits[0, 5] = 2.0
    ties = torch.arange(10, V, 3)[:90]  # 90 logits of 1.0, every third index from 10: 5 chunks of 64
    logits[0, ties] = 1.0
    q, top = 1.0 / (torch.e + 90), torch.e / (torch.e + 90)  # each tie's and the 2.0's probability
    # the 2.0, then ties while the mass before them is below top_p: 37 of them
    top_p = torch.tensor([top + 36.5 * q])
    tau, cut = top_p_cut(logits.to(DEV), torch.ones(1, device=DEV), top_p.to(DEV), chunk=64)
    assert tau.tolist() == [1.0] and cut.tolist() == [int(ties[36])] == [118]
    want = kept_by_sort(logits, torch.ones(1), top_p)
    assert torch.equal(kept_by_cut(logits.to(DEV), tau, cut).cpu(), want) and int(want.sum()) == 38


def test_the_chunking_does_not_change_the_cut() -> None:
    g = torch.Generator().manual_seed(22)
    logits, temperature, top_p = rows(g, 1000, "bf16", 1.0, 0.0, 1.0)
    first = top_p_cut(logits, temperature, top_p, chunk=64)
    for chunk in (128, 256, 1024, 0):
        assert all(map(torch.equal, top_p_cut(logits, temperature, top_p, chunk=chunk), first))
    with pytest.raises(ValueError, match="power of two"):
        top_p_cut(logits, temperature, top_p, chunk=96)


@pytest.mark.parametrize("use_cut", [False, True])
def test_sample_with_the_search_draws_what_the_sort_draws(use_cut: bool, monkeypatch) -> None:
    g = torch.Generator().manual_seed(23)
    V = 397
    logits = (torch.randn(8, V, generator=g) * 2).bfloat16().float().to(DEV)
    p = {
        "temperature": torch.tensor([1.0, 0.0, 0.8, 1.2, 1.0, 0.7, 1.0, 1.5], device=DEV),
        "top_k": torch.tensor([0, 0, 5, 0, 40, 0, 0, 3], dtype=torch.int32, device=DEV),
        "top_p": torch.tensor([0.9, 0.5, 0.7, 0.3, 1.0, 0.95, 1.0, 0.6], device=DEV),
        "seeds": torch.arange(8, device=DEV) * 7919,
        "offsets": torch.full((8,), 33, device=DEV),
    }
    monkeypatch.setattr(sampling, "USE_CUT", use_cut)
    want = sample(logits, **p, filtered=True)  # the sort
    assert torch.equal(sample(logits, **p, filtered=True, k_cap=40, top_p_search=True), want)
    # draws over many offsets: the filtered sets, not one lucky draw
    many = {**p, "offsets": torch.arange(8, device=DEV) + 1000}
    for _ in range(3):
        many["offsets"] += 8
        assert torch.equal(
            sample(logits, **many, filtered=True, k_cap=40, top_p_search=True),
            sample(logits, **many, filtered=True),
        )


@pytest.mark.parametrize(
    ("top_ks", "filtered", "search_on", "plan"),
    [
        ([50, 0], [True, True], True, (50, True)),  # top-k rows by filter_cut, the top-p row searched
        ([0, 0, 9], [True, True, False], True, (0, True)),  # the unfiltered 9 does not count
        ([50, 0], [True, True], False, (0, False)),  # off: the sort
        ([50, 20], [True, True], True, (50, False)),  # top-k only: mask_within_top_k
        ([sampling_filter.TOP_K_FAST_MAX + 1, 0], [True, True], True, (0, False)),  # a large top_k: the sort
        ([0], [False], True, (0, False)),
    ],
)
def test_filter_plan(top_ks, filtered, search_on, plan, monkeypatch) -> None:
    monkeypatch.setattr(sampling_filter, "TOP_P_SEARCH", search_on)
    assert sampling_filter.filter_plan(top_ks, filtered) == plan


@gpu
def test_gpu_search_on_full_vocab_keeps_what_the_sort_keeps() -> None:
    g = torch.Generator(device="cuda").manual_seed(24)
    logits = (torch.randn(64, 201088, device="cuda", generator=g) * 3).bfloat16().float()
    temperature = torch.rand(64, device="cuda", generator=g) + 0.5
    top_p = torch.rand(64, device="cuda", generator=g)
    tau, cut = top_p_cut(logits, temperature, top_p)
    assert torch.equal(kept_by_cut(logits, tau, cut), kept_by_sort(logits, temperature, top_p))


def test_one_chunks_bound_serves_every_batch_size():
    """CHUNKS, a constexpr, must not follow the batch (chunk_size does): else each batch size
    compiles the search again, which no warm-up or precompile manifest can cover."""
    from gptoss.kernels.sampling_filter import chunk_size, chunks_bound

    v = 201_088
    sizes = {chunk_size(b, v) for b in range(1, 4097)}
    assert sizes == {2048, 4096, 8192, 16384}
    assert {chunks_bound(v, c) for c in sizes} == {128}
    assert chunks_bound(1500, 64) == 32  # a test's small chunks: as many as they make

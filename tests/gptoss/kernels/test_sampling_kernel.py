"""Device sampling (gptoss.kernels.sampling): greedy, seeded Gumbel-max draws, top-k / top-p, checked
against torch and by chi-square.

Runs in Triton's interpreter on CPU (TRITON_INTERPRET=1, the default here). On a GPU machine run
`TRITON_INTERPRET=0 pytest tests/gptoss/kernels/test_sampling_kernel.py`: the same tests then run
compiled on CUDA, plus the full-vocabulary one.
"""

from __future__ import annotations

import math

import pytest
import torch

from gptoss.kernels import sampling, sampling_draw, sampling_filter
from gptoss.kernels.sampling import sample
from tests.gptoss.kernels.kernelkit import (  # conftest set TRITON_INTERPRET before triton loaded
    DEV,
    INTERPRETER_WARNINGS,
    gpu,
)

pytestmark = INTERPRETER_WARNINGS


def params(
    B: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 7,
    offsets: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    return {
        "temperature": torch.full((B,), temperature, device=DEV),
        "top_k": torch.full((B,), top_k, dtype=torch.int32, device=DEV),
        "top_p": torch.full((B,), top_p, device=DEV),
        "seeds": torch.full((B,), seed, dtype=torch.int64, device=DEV),
        "offsets": torch.arange(B, device=DEV) if offsets is None else offsets.to(DEV),
    }


def test_greedy_is_argmax_first_on_ties() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 5000, generator=g).to(DEV)
    logits[1, [700, 300, 4900]] = 9.0  # ties inside a chunk and across chunks: index 300 wins
    logits[2] = 0.0  # all equal: index 0
    logits[3, -1] = 50.0  # the last element of a ragged final chunk
    ids = sample(logits, **params(6, temperature=0.0), filtered=False)
    assert ids.tolist() == torch.argmax(logits, -1).tolist()
    assert ids[1].item() == 300 and ids[2].item() == 0 and ids[3].item() == 4999


def test_greedy_full_vocab() -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 201088, generator=g).to(DEV)
    logits[1, [150000, 200000]] = 30.0
    ids = sample(logits, **params(2, temperature=0.0), filtered=False)
    assert ids.tolist() == [torch.argmax(logits[0]).item(), 150000]


def test_sampled_reproducible_and_fresh_per_offset() -> None:
    logits = torch.zeros(1, 1000, device=DEV)  # uniform: any id is as likely
    p = params(1, offsets=torch.tensor([5]))
    a, b = sample(logits, **p, filtered=False), sample(logits, **p, filtered=False)
    assert a.item() == b.item()
    many = sample(logits.expand(40, -1), **params(40), filtered=False).tolist()
    assert len(set(many)) >= 30  # 40 draws from 1000: a repeat or two, not a constant
    other_seed = sample(logits.expand(40, -1), **params(40, seed=8), filtered=False).tolist()
    assert sum(x == y for x, y in zip(many, other_seed, strict=False)) <= 3


def test_batch_position_and_composition_invariance() -> None:
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(8, 3000, generator=g).to(DEV)
    temps = torch.tensor([1.0, 0.0, 0.7, 1.3, 0.0, 1.0, 2.0, 0.5], device=DEV)
    p = params(8, offsets=torch.arange(100, 108))
    p["temperature"] = temps
    p["seeds"] = torch.arange(8, device=DEV) * 1000003 - 3  # a negative seed too
    ids = sample(logits, **p, filtered=False)
    perm = torch.tensor([5, 2, 7, 0, 3, 6, 1, 4], device=DEV)
    permuted = sample(logits[perm], **{k: v[perm] for k, v in p.items()}, filtered=False)
    assert permuted.tolist() == ids[perm].tolist()
    alone = [
        sample(logits[i : i + 1], **{k: v[i : i + 1] for k, v in p.items()}, filtered=False).item()
        for i in (0, 3)
    ]
    assert alone == [ids[0].item(), ids[3].item()]
    # A neighbour with top-k turns the filtered path on; unfiltered rows must not change.
    p["top_k"] = torch.tensor([0, 0, 0, 0, 0, 0, 5, 0], dtype=torch.int32, device=DEV)
    mixed = sample(logits, **p, filtered=True)
    assert [mixed[i].item() for i in range(8) if i != 6] == [ids[i].item() for i in range(8) if i != 6]


def test_chunking_does_not_change_the_draw(monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 40000, generator=g).to(DEV)
    p = params(2, offsets=torch.tensor([11, 12]))
    got = []
    for chunk in (2048, 16384):
        monkeypatch.setattr(sampling_draw, "_chunk_size", lambda b, v, most, c=chunk: c)
        got.append(sampling_draw.gumbel_argmax(logits, p["temperature"], p["seeds"], p["offsets"]).tolist())
    assert got[0] == got[1]


def chi_square(ids: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(ids.cpu(), minlength=len(probs)).double()
    want = probs.double() * len(ids)
    return float(((counts - want) ** 2 / want).sum())


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_draws_follow_softmax(temperature: float) -> None:
    B = 4000
    probs = torch.tensor([0.3, 0.2, 0.15, 0.1, 0.1, 0.08, 0.05, 0.02])
    logits = (probs.log() * temperature + 1.5).expand(B, -1).contiguous().to(DEV)  # softmax(l/T) = probs
    ids = sample(logits, **params(B, temperature=temperature, seed=12345), filtered=False)
    counts = torch.bincount(ids.cpu(), minlength=8).double()
    # 7 degrees of freedom: P(chi2 > 35) ~ 1e-5; and every class within 4 sigma.
    assert chi_square(ids, probs) < 35.0
    sigma = (B * probs.double() * (1 - probs.double())).sqrt()
    assert bool(((counts - B * probs.double()).abs() <= 4 * sigma).all())


def test_top_k_one_is_greedy_and_top_k_three_stays_in_top_three() -> None:
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(16, 64, generator=g).to(DEV)
    logits[3, [10, 40]] = 5.0  # a tie for the top: k=1 keeps the first
    one = sample(logits, **params(16, top_k=1), filtered=True)
    assert one.tolist() == torch.argmax(logits, -1).tolist()
    B = 300
    flat = torch.tensor([2.0, 1.9, 1.8, 1.7, 1.6] + [0.0] * 59, device=DEV).expand(B, -1).contiguous()
    ids = sample(flat, **params(B, top_k=3), filtered=True)
    assert set(ids.tolist()) == {0, 1, 2}


def test_top_p_keeps_the_head() -> None:
    B = 300
    probs = torch.tensor([0.6, 0.2, 0.1, 0.05, 0.03, 0.02])
    logits = probs.log().expand(B, -1).contiguous().to(DEV)
    assert set(sample(logits, **params(B, top_p=0.5), filtered=True).tolist()) == {0}
    assert set(sample(logits, **params(B, top_p=0.7), filtered=True).tolist()) == {0, 1}
    mixed = sample(logits, **params(B, top_k=2, top_p=0.9), filtered=True)  # k binds before p
    assert set(mixed.tolist()) == {0, 1}


def _mixed_rows(g: torch.Generator, V: int, ties: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """12 rows: a greedy one, an unfiltered sampled one, the rest top-k (1-60) with top-p in (0, 1.2)."""
    logits = torch.randn(12, V, generator=g) * 3
    if ties == "bf16":  # the lm_head's bf16 values: many logits equal
        logits = logits.bfloat16().float()
    elif ties == "int":
        logits = logits.round()
    p = params(12, seed=3)
    p["temperature"] = torch.rand(12, generator=g) + 0.2
    p["temperature"][0] = 0.0
    p["top_k"] = torch.randint(1, 61, (12,), generator=g, dtype=torch.int32)
    p["top_k"][1] = 0
    p["top_p"] = torch.rand(12, generator=g) * 1.2
    p["top_p"][1] = 1.0
    logits[3, :5] = float("-inf")
    return logits.to(DEV), {k: v.to(DEV) for k, v in p.items()}


@pytest.mark.parametrize("ties", ["none", "bf16", "int"])
def test_within_top_k_masks_what_the_sort_masks(ties: str) -> None:
    g = torch.Generator().manual_seed(11)
    for V in (61, 200, 397):
        logits, p = _mixed_rows(g, V, ties)
        k_cap = int(p["top_k"].max())
        want = sampling_filter.mask_top_k_top_p(logits, p["temperature"], p["top_k"], p["top_p"])
        got = sampling_filter.mask_within_top_k(logits, p["temperature"], p["top_k"], p["top_p"], k_cap)
        assert torch.equal(got, want), (V, (got != want).any(-1).nonzero().flatten().tolist())
        assert torch.equal(got[:2], logits[:2])  # the greedy and the unfiltered row are untouched
        both = {k: v for k, v in p.items() if k in ("temperature", "top_k", "top_p", "seeds", "offsets")}
        assert torch.equal(
            sample(logits, **both, filtered=True, k_cap=k_cap), sample(logits, **both, filtered=True)
        )


@pytest.mark.parametrize("ties", ["bf16", "int"])
def test_the_cut_keeps_what_the_masked_copy_keeps(ties: str, monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(12)
    for V in (61, 397, 1500):  # 1500: the cut scan crosses its 1024-wide blocks
        logits, p = _mixed_rows(g, V, ties)
        logits[4, 100 % V] = float("nan")
        k_cap = int(p["top_k"].max())
        masked = sampling_filter.mask_within_top_k(logits, p["temperature"], p["top_k"], p["top_p"], k_cap)
        tau, cut = sampling_filter.filter_cut(logits, p["temperature"], p["top_k"], p["top_p"], k_cap)
        chunked = sampling_filter.filter_cut(
            logits, p["temperature"], p["top_k"], p["top_p"], k_cap, chunk=64
        )
        assert torch.equal(chunked[1], cut)  # the ties counted over chunks: the same cut
        torch.testing.assert_close(chunked[0], tau, rtol=0, atol=0, equal_nan=True)
        idx = torch.arange(V, device=DEV)[None, :]
        kept = (logits > tau[:, None]) | ((logits == tau[:, None]) & (idx <= cut[:, None])) | logits.isnan()
        gone = logits == float("-inf")  # -inf logits cannot be drawn either way
        assert torch.equal(kept | gone, (masked != float("-inf")) | gone)
        assert cut[:2].tolist() == [V, V]  # the greedy and the unfiltered row keep everything
        monkeypatch.setattr(sampling, "USE_CUT", False)  # the masked copy
        want = sample(logits, **p, filtered=True, k_cap=k_cap)
        monkeypatch.setattr(sampling, "USE_CUT", True)
        assert torch.equal(sample(logits, **p, filtered=True, k_cap=k_cap), want)
        monkeypatch.setattr(sampling, "USE_CUT", False)
        assert want[4].item() == -1


@pytest.mark.parametrize("chunk", [0, 64, 16])
def test_the_cut_falls_inside_a_tie_run_that_crosses_chunks(chunk: int) -> None:
    """10 logits of 5.0, then 91 ties of 2.0 every third index from 20: top_k 47 keeps the first 37
    of them by index, so the cut is the 37th's index (20 + 36 * 3), however the row is chunked."""
    logits = torch.full((2, 300), -5.0)
    logits[:, :10] = 5.0
    logits[:, 20:293:3] = 2.0
    p = params(2, top_k=47)
    p["top_k"][1] = 0  # left whole: tau -inf, cut V
    tau, cut = sampling_filter.filter_cut(logits.to(DEV), p["temperature"], p["top_k"], p["top_p"], 47, chunk)
    assert tau.tolist() == [2.0, float("-inf")] and cut.tolist() == [128, 300]


def test_within_top_k_splits_a_tie_run_by_index() -> None:
    logits = torch.tensor([[1.0, 3.0, 5.0, 3.0, 3.0, 3.0, 0.5]], device=DEV)
    p = params(1, top_k=3)
    got = sampling_filter.mask_within_top_k(logits, p["temperature"], p["top_k"], p["top_p"], 3)
    inf = float("-inf")
    assert got.tolist() == [[inf, 3.0, 5.0, 3.0, inf, inf, inf]]  # 5, then the first two 3s by index
    # top-p over those three (probs 0.78, 0.11, 0.11): 0.8 needs the first 3 as well, not the second
    p["top_p"][:] = 0.8
    got = sampling_filter.mask_within_top_k(logits, p["temperature"], p["top_k"], p["top_p"], 3)
    assert got.tolist() == [[inf, 3.0, 5.0, inf, inf, inf, inf]]


def test_within_top_k_leaves_a_nan_row_to_fail() -> None:
    logits = torch.randn(2, 50, device=DEV)
    logits[0, 9] = float("nan")
    p = params(2, top_k=4, top_p=0.8)
    got = sampling_filter.mask_within_top_k(logits, p["temperature"], p["top_k"], p["top_p"], 4)
    assert bool(torch.isnan(got[0, 9])) and int(torch.isfinite(got[1]).sum()) >= 1
    assert sample(logits, **p, filtered=True, k_cap=4).tolist()[0] == -1


@pytest.mark.parametrize(
    ("top_ks", "filtered", "cap"),
    [
        ([50, 20, 0], [True, True, False], 50),  # the unfiltered row's 0 does not count
        ([50, 0], [True, True], 0),  # a top-p-only row: the sort
        ([sampling_filter.TOP_K_FAST_MAX + 1], [True], 0),
        ([sampling_filter.TOP_K_FAST_MAX, 3], [True, True], sampling_filter.TOP_K_FAST_MAX),
        ([7, 7], [False, False], 0),  # nothing filtered
    ],
)
def test_top_k_cap_takes_the_fast_mask_only_when_every_filtered_row_has_a_small_top_k(top_ks, filtered, cap):
    assert sampling_filter.top_k_cap(top_ks, filtered) == cap


@pytest.mark.parametrize("filtered", [False, True])
def test_nan_row_returns_minus_one(filtered: bool) -> None:
    logits = torch.randn(3, 100, device=DEV)
    logits[1, 37] = float("nan")
    p = params(3)
    p["temperature"][2] = 0.0
    p["top_k"][0] = 5
    ids = sample(logits, **p, filtered=filtered)
    assert ids[1].item() == -1
    assert 0 <= ids[0].item() < 100 and ids[2].item() == torch.argmax(logits[2]).item()


def test_sample_checks_its_inputs() -> None:
    p = params(2)
    p["seeds"] = p["seeds"].int()
    with pytest.raises(ValueError, match="seeds must be"):
        sample(torch.zeros(2, 10, device=DEV), **p, filtered=False)
    p = params(2)
    with pytest.raises(ValueError, match="rows must be int64"):
        sample(torch.zeros(2, 10, device=DEV), **p, filtered=True, rows=torch.tensor([1], device=DEV).int())


@pytest.mark.parametrize("how", ["unfiltered", "filtered", "some rows filtered"])
def test_bf16_logits_draw_the_ids_of_their_float32_copy(how: str) -> None:
    """lm_head's own bf16 logits: drawn as read (each widened exactly), the filters on a float32 copy
    of the rows they filter; every id the float32 logits' own, NaN and -inf rows included."""
    g = torch.Generator().manual_seed(9)
    logits = (torch.randn(6, 5000, generator=g) * 3).bfloat16()
    logits[2, 100:] = float("-inf")
    logits[4, 7] = float("nan")
    p = params(6, offsets=torch.arange(20, 26))
    p["temperature"] = torch.tensor([1.0, 0.0, 0.7, 1.0, 1.0, 1.3], device=DEV)
    kw: dict = {"filtered": how != "unfiltered"}
    if kw["filtered"]:
        p["top_p"] = torch.tensor([0.9, 1.0, 0.5, 1.0, 0.8, 1.0], device=DEV)
        p["top_k"] = torch.tensor([0, 0, 0, 0, 0, 40], dtype=torch.int32, device=DEV)
    if how == "some rows filtered":
        p["top_p"][[2, 4]] = 1.0
        kw["rows"] = torch.tensor([0, 5], device=DEV)
    got = sample(logits.to(DEV), **p, **kw).tolist()
    assert got == sample(logits.float().to(DEV), **p, **kw).tolist()
    assert got[4] == -1 and 0 <= got[2] < 100 and got[1] == torch.argmax(logits[1].float()).item()
    with pytest.raises(ValueError, match="logits must be float32 or bfloat16"):
        sample(logits.half().to(DEV), **p, **kw)


def _ten_rows(g: torch.Generator) -> tuple[torch.Tensor, dict[str, torch.Tensor], list[int]]:
    """10 rows of 300 bf16-valued logits: greedy, unfiltered, NaN and filtered ones; the filtered rows."""
    logits = (torch.randn(10, 300, generator=g) * 2).bfloat16().float().to(DEV)
    p = params(10, seed=5)
    p["temperature"] = torch.tensor([0.0, 1.0, 0.9, 1.0, 0.7, 1.1, 1.0, 0.8, 1.3, 1.0], device=DEV)
    p["top_k"] = torch.tensor([0, 0, 7, 0, 3, 0, 0, 12, 0, 0], dtype=torch.int32, device=DEV)
    p["top_p"] = torch.tensor([1.0, 1.0, 0.8, 0.6, 1.0, 1.0, 1.0, 0.5, 0.9, 1.0], device=DEV)
    logits[7, 3] = logits[9, 4] = float("nan")  # a filtered row and an unfiltered one fail
    return logits, p, [2, 3, 4, 7, 8]


@pytest.mark.parametrize(("k_cap", "search"), [(0, False), (12, True)])  # the sort; the search + top-k
def test_filtering_only_the_filtered_rows_draws_the_same_ids(k_cap: int, search: bool) -> None:
    g = torch.Generator().manual_seed(31)
    logits, p, picked = _ten_rows(g)
    rows = torch.tensor(picked, device=DEV)
    for offset in (0, 50):
        p["offsets"] += offset
        want = sample(logits, **p, filtered=True)  # every row through the sort
        got = sample(logits, **p, filtered=True, k_cap=k_cap, top_p_search=search, rows=rows)
        assert torch.equal(got, want) and got[7].item() == got[9].item() == -1
    only_k = {**p, "top_k": torch.where(p["top_k"] > 0, p["top_k"], 0), "top_p": torch.ones(10, device=DEV)}
    rows_k = torch.tensor([2, 4, 7], device=DEV)  # the top-k rows alone: mask_within_top_k
    want = sample(logits, **only_k, filtered=True)
    assert torch.equal(sample(logits, **only_k, filtered=True, k_cap=12, rows=rows_k), want)


def test_the_sort_takes_a_large_batch_in_blocks_of_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(32)
    logits, p, _ = _ten_rows(g)
    want = sample(logits, **p, filtered=True)
    seen: list[int] = []
    real = sampling.mask_top_k_top_p
    monkeypatch.setattr(sampling, "mask_top_k_top_p", lambda x, *a: seen.append(x.shape[0]) or real(x, *a))
    monkeypatch.setattr(sampling, "SORT_ROWS", 4)
    assert torch.equal(sample(logits, **p, filtered=True), want)
    assert seen == [4, 4, 2]


@gpu
def test_gpu_draws_follow_softmax_on_full_vocab() -> None:
    B, V = 20000, 201088
    logits = torch.full((1, V), -math.inf, device="cuda")
    probs = torch.tensor([0.4, 0.3, 0.2, 0.1])
    logits[0, [5, 70000, 150000, 201087]] = probs.log().cuda()
    ids = sample(logits.expand(B, -1), **params(B), filtered=False)
    remap = torch.tensor([5, 70000, 150000, 201087], device="cuda")
    assert bool((remap == ids[:, None]).any(-1).all())
    assert chi_square((remap == ids[:, None]).int().argmax(-1), probs) < 25.0


@gpu
def test_gpu_greedy_and_filtered_draws_on_full_vocab() -> None:
    logits = torch.randn(1024, 201088, device="cuda") * 3
    greedy = sample(logits, **params(1024, temperature=0.0), filtered=False)
    assert torch.equal(greedy, torch.argmax(logits, -1))
    drawn = sample(logits, **params(1024, top_k=50, top_p=0.9), filtered=True)
    assert bool((drawn >= 0).all())
    top50 = logits.topk(50, -1).indices
    assert bool((top50 == drawn[:, None]).any(-1).all())

"""The screened Gumbel draw (gptoss.kernels.sampling_draw.SCREEN): the bound it screens by, the same ids
as the unscreened draw bit for bit, and the logs it skips.

Runs in Triton's interpreter on CPU; `TRITON_INTERPRET=0` runs all but the counting test compiled.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from gptoss.kernels import sampling_draw, sampling_noise
from gptoss.kernels.sampling import sample
from tests.gptoss.kernels.kernelkit import DEV, INTERPRET, INTERPRETER_WARNINGS

pytestmark = INTERPRETER_WARNINGS


@triton.jit
def _probe_kernel(w_ptr, g_ptr, bound_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    w = tl.load(w_ptr + offs, mask=m, other=1.0)
    tl.store(g_ptr + offs, sampling_noise._gumbel(w), mask=m)
    tl.store(bound_ptr + offs, sampling_noise._gumbel_bound(w), mask=m)


def _w_of(h: torch.Tensor) -> torch.Tensor:
    """_uniform's w for 32-bit hashes h (int64 holding 0..2^32-1), with its float32 roundings."""
    return (h.to(torch.float32) + 0.5) * 2.3283064365386963e-10


def test_the_bound_is_above_every_gumbel_and_tight_where_winners_are() -> None:
    edge = 1 << 26  # w = 1/64: where _gumbel turns from the series to the log
    h = torch.cat(
        [
            torch.arange(0, 1 << 16),  # the smallest w: the largest g
            torch.arange(edge - 4096, edge + 4096),
            torch.arange(0, 1 << 32, 4099),  # a sweep of the whole range
            torch.tensor([(1 << 32) - 1]),  # w rounds to 1: g = -inf
        ]
    )
    w = _w_of(h).to(DEV)
    g, bound = torch.empty_like(w), torch.empty_like(w)
    _probe_kernel[(triton.cdiv(w.numel(), 1024),)](w, g, bound, w.numel(), BLOCK=1024)
    g, bound, w = g.cpu(), bound.cpu(), w.cpu()
    assert g[-1].item() == float("-inf") and bound[-1].item() > 0
    assert bool((bound >= g).all()), f"bound below g at w = {w[bound < g][:5].tolist()}"
    assert bool((bound - g >= 5e-5).all())  # the margin holds where the bound is tightest
    # Where a winner's g lives (w small, g large) the bound is within ln(2) * 0.087 + margin.
    small = w < 1e-3
    assert float((bound - g)[small].max()) < 0.0605
    assert float(g.max()) > 22.0  # the sweep reached the top of g's range


def _draw(logits: torch.Tensor, p: dict[str, torch.Tensor], screen: int, **kw) -> list[int]:
    """sample() with every launch in mode `screen`, whatever its rows (SCREEN_FROM 1)."""
    old = sampling_draw.SCREEN, sampling_draw.SCREEN_FROM
    sampling_draw.SCREEN, sampling_draw.SCREEN_FROM = screen, 1
    try:
        return sample(logits, **p, **kw).tolist()
    finally:
        sampling_draw.SCREEN, sampling_draw.SCREEN_FROM = old


def _rows(kind: str, g: torch.Generator) -> torch.Tensor:
    """4 rows of 20,000 logits of one kind."""
    B, V = 4, 20000
    if kind == "flat":  # random weights' logits
        return torch.randn(B, V, generator=g) * 3
    if kind == "peaked":  # a trained model's: a few tokens far above the rest
        x = torch.randn(B, V, generator=g) * 2
        x[:, torch.randint(0, V, (6,), generator=g)] += torch.linspace(8, 18, 6)
        return x
    if kind == "rising":  # every step holds a new best: screening's worst case
        return torch.linspace(0, 40, V).expand(B, -1) + torch.rand(B, V, generator=g)
    assert kind == "masked"  # -inf runs (a row with nothing left, ties of -inf), a NaN row
    x = torch.randn(B, V, generator=g) * 3
    x[0] = float("-inf")
    x[1, :15000] = float("-inf")
    x[2, 5000:] = float("-inf")
    x[3, 12345] = float("nan")
    return x


@pytest.mark.parametrize("screen", [1, 2])
@pytest.mark.parametrize("chunk", [2048, 16384])
@pytest.mark.parametrize("kind", ["flat", "peaked", "rising", "masked"])
def test_the_screened_draw_is_the_unscreened_draw(kind: str, chunk: int, screen: int, monkeypatch) -> None:
    monkeypatch.setattr(sampling_draw, "_chunk_size", lambda b, v, most: chunk)
    g = torch.Generator().manual_seed(41)
    logits = _rows(kind, g).to(DEV)
    p = {
        "temperature": torch.tensor([1.0, 0.7, 1.0, 1.6], device=DEV),
        "top_k": torch.zeros(4, dtype=torch.int32, device=DEV),
        "top_p": torch.ones(4, device=DEV),
        "seeds": torch.tensor([3, -9, 1 << 40, 0], device=DEV),
    }
    for offset in (0, 11, 26):
        p["offsets"] = torch.arange(4, device=DEV) + offset
        want = _draw(logits, p, 0, filtered=False)
        assert _draw(logits, p, screen, filtered=False) == want
        if kind == "masked":
            assert want[0] == 0 and 15000 <= want[1] and want[2] < 5000 and want[3] == -1


@pytest.mark.parametrize("screen", [1, 2])
@pytest.mark.parametrize(("k_cap", "search"), [(0, True), (40, False)])  # top-p's search; top-k's cut
def test_the_screened_cut_draws_what_the_unscreened_cut_draws(k_cap, search, screen, monkeypatch) -> None:
    monkeypatch.setattr(sampling_draw, "_chunk_size", lambda b, v, most: 16384)
    g = torch.Generator().manual_seed(42)
    logits = _rows("peaked", g).to(DEV)
    p = {
        "temperature": torch.tensor([1.0, 0.8, 0.0, 1.2], device=DEV),
        "top_k": torch.tensor([0, 40, 0, 5] if k_cap else [0, 0, 0, 0], dtype=torch.int32, device=DEV),
        "top_p": torch.tensor([0.9, 1.0, 0.5, 0.95], device=DEV),
        "seeds": torch.arange(4, device=DEV) * 7919,
    }
    for offset in (0, 9):
        p["offsets"] = torch.arange(4, device=DEV) + offset
        kw = {"filtered": True, "k_cap": k_cap, "top_p_search": search}
        assert _draw(logits, p, screen, **kw) == _draw(logits, p, 0, **kw)


_COUNTED: list[int] = []  # the elements each interpreted _gumbel call took (module level: the
_REAL_GUMBEL = sampling_noise._gumbel  # interpreter runs a jit function against its module's globals)


@triton.jit
def _counting_gumbel(w):
    _COUNTED.append(w.shape[0] * w.shape[1])
    return _REAL_GUMBEL(w)


@pytest.mark.skipif(not INTERPRET, reason="counts the logs' calls in the interpreter")
@pytest.mark.parametrize(
    ("kind", "screen", "at_most"),
    [("flat", 1, 0.35), ("peaked", 1, 0.37), ("rising", 1, 0.92), ("flat", 2, 0.25), ("peaked", 2, 0.25)],
)
def test_screening_skips_the_logs_of_most_steps(kind: str, screen: int, at_most: float, monkeypatch) -> None:
    """A row of 20,000 in chunks of 16,384: unscreened 16 steps of 1,024, then 4; screened (steps of
    SCREEN_BLOCK, 256) 64, then 15. Mode 1: a chunk's first step always takes the logs, a later one
    when a bound could beat the chunk's best so far; on a rising row nearly every step holds a new
    best. Mode 2: the second chunk starts from the first one's best (the interpreter runs every row's
    first chunk before the second ones)."""
    monkeypatch.setattr(sampling_draw, "_chunk_size", lambda b, v, most: 16384)
    counted = _COUNTED
    counted.clear()
    monkeypatch.setattr(sampling_draw, "_gumbel", _counting_gumbel)
    g = torch.Generator().manual_seed(43)
    logits = _rows(kind, g)
    p = {
        "temperature": torch.ones(4),
        "top_k": torch.zeros(4, dtype=torch.int32),
        "top_p": torch.ones(4),
        "seeds": torch.arange(4),
        "offsets": torch.arange(4) + 100,
    }
    full = _draw(logits, p, 0, filtered=False)
    every = sum(counted)
    assert every == 4 * 20480  # 4 rows, 20 steps of 1,024 each (the last one masked at V)
    counted.clear()
    assert _draw(logits, p, screen, filtered=False) == full
    assert sum(counted) <= at_most * every
    assert sum(counted) >= 4 * sampling_draw.SCREEN_BLOCK  # a row's first step always takes them
    assert sum(counted) % sampling_draw.SCREEN_BLOCK == 0  # in steps of the screened launch's shape


def test_launches_screen_from_64_rows_in_mode_1() -> None:
    assert (sampling_draw.SCREEN, sampling_draw.SCREEN_FROM) == (1, 64)
    assert [sampling_draw.screen_mode(b, False) for b in (1, 2, 63, 64, 65, 1024)] == [0, 0, 0, 1, 1, 1]
    # Screened unfiltered launches step 256 on one warp in chunks of up to 8,192 (v70's sweep); the
    # unscreened ones and the cut's keep 1,024 on 4 warps in chunks of up to 16,384.
    shape = sampling_draw.launch_shape
    assert [shape(b, False) for b in (1, 63, 64, 1024)] == [(1024, 4, 16384)] * 2 + [(256, 1, 8192)] * 2
    assert shape(1024, True) == (1024, 4, 16384)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sampling_draw, "SCREEN", 2)
        assert sampling_draw.screen_mode(64, single=False) == 2
        assert sampling_draw.screen_mode(64, single=True) == 1  # no other chunk to share a best with
        assert sampling_draw.screen_mode(8, single=False) == 0
        mp.setattr(sampling_draw, "SCREEN", 0)
        assert shape(1024, False) == (1024, 4, 16384)  # unscreened: the unscreened shape


@pytest.mark.skipif(not INTERPRET, reason="counts the logs' calls in the interpreter")
def test_the_default_draw_skips_logs_at_64_rows_and_not_at_63(monkeypatch) -> None:
    """The defaults as sample() runs them: rows of 4,096 in one chunk; 63 rows take the logs on every
    step (4 of 1,024), 64 rows (16 steps of 256) only where a bound could beat the best so far (at
    least each row's first step, at most a quarter of the elements here), with the unscreened ids."""
    monkeypatch.setattr(sampling_draw, "_chunk_size", lambda b, v, most: 4096)
    monkeypatch.setattr(sampling_draw, "_gumbel", _counting_gumbel)
    logits = torch.randn(64, 4096, generator=torch.Generator().manual_seed(44)) * 3
    ones, no_k = torch.ones(64), torch.zeros(64, dtype=torch.int32)
    for b, elements in ((63, (63 * 4096, 63 * 4096)), (64, (64 * 256, 64 * 1024))):
        _COUNTED.clear()
        ids = sample(
            logits[:b], ones[:b], no_k[:b], ones[:b], torch.arange(b), torch.arange(b), filtered=False
        )
        assert elements[0] <= sum(_COUNTED) <= elements[1], (b, sum(_COUNTED))
        p = {"temperature": ones[:b], "top_k": no_k[:b], "top_p": ones[:b], "seeds": torch.arange(b)}
        assert ids.tolist() == _draw(logits[:b], p | {"offsets": torch.arange(b)}, 0, filtered=False)

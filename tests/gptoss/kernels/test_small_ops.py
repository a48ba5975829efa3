"""Fused RMSNorm, RoPE + cache write and device sampling, checked against gptoss.model and torch.

Runs in Triton's interpreter on CPU (TRITON_INTERPRET=1, the default here). On a GPU machine run
`TRITON_INTERPRET=0 pytest tests/gptoss/kernels/test_small_ops.py`: the same tests then run compiled
on CUDA, plus the full-shape ones.
"""

from __future__ import annotations

import math
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

import pytest
import torch
import triton
import triton.language as tl

from gptoss.config import PRESETS
from gptoss.kernels import sampling
from gptoss.kernels.rmsnorm import fused_add_rms_norm
from gptoss.kernels.rope import build_cos_sin, rope_qkv
from gptoss.kernels.rounding import round_to
from gptoss.kernels.sampling import sample
from gptoss.model import Rope, apply_rope, rms_norm

INTERPRET = os.environ["TRITON_INTERPRET"] == "1"
DEV = "cpu" if INTERPRET else "cuda"
# The interpreter turns a runtime loop bound (a 1-element array) into an int with a NumPy deprecation.
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")
gpu = pytest.mark.skipif(
    INTERPRET or not torch.cuda.is_available(), reason="needs CUDA and TRITON_INTERPRET=0"
)


def assert_within_ulp(got: torch.Tensor, want: torch.Tensor, max_ulp: int, min_exact: float) -> None:
    """bf16 tensors equal up to max_ulp units in the last place, and mostly bit-equal."""
    assert got.dtype == want.dtype == torch.bfloat16 and got.shape == want.shape
    a, b = got.view(torch.int16).int(), want.view(torch.int16).int()
    # Adjacent bf16 values of one sign differ by 1 as integers; +0 and -0 count as equal.
    ulps = torch.where(got.float() == want.float(), 0, (a - b).abs())
    assert int(ulps.max()) <= max_ulp
    assert (ulps == 0).float().mean().item() >= min_exact


# ---------------------------------------------------------------------------------- rounding


@triton.jit
def _round_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n)
    tl.store(y_ptr + i, round_to(x, y_ptr.dtype.element_ty), mask=i < n)


def test_round_to_bf16_is_torchs_round_to_nearest_even() -> None:
    g = torch.Generator().manual_seed(5)
    bits = torch.randint(-(2**31), 2**31, (4096,), generator=g, dtype=torch.int64).to(torch.int32)
    special = torch.tensor(
        [
            1.0,
            1.00390625,
            1.01171875,
            -1.00390625,
            3.3895314e38,
            3.4028235e38,
            float("inf"),
            -float("inf"),
            0.0,
            -0.0,
            1e-40,
        ]
    )  # ties, overflow, subnormal
    x = torch.cat((bits.view(torch.float32), special)).to(DEV)
    x = x[~torch.isnan(x)]
    y = torch.empty(x.shape, dtype=torch.bfloat16, device=DEV)
    _round_kernel[(triton.cdiv(len(x), 1024),)](x, y, len(x), BLOCK=1024)
    assert torch.equal(y.view(torch.int16), x.bfloat16().view(torch.int16))
    nan = torch.full((4,), float("nan"), device=DEV)
    _round_kernel[(1,)](nan, y, 4, BLOCK=4)
    assert bool(torch.isnan(y[:4]).all())


# ----------------------------------------------------------------------------------- RMSNorm


@pytest.mark.parametrize("H,T", [(64, 1), (64, 5), (96, 1), (96, 5), (2880, 3)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rmsnorm_fp32(H: int, T: int, with_residual: bool) -> None:
    g = torch.Generator().manual_seed(H * 10 + T)
    x = torch.randn(T, H, generator=g).to(DEV) * 3
    res = torch.randn(T, H, generator=g).to(DEV) if with_residual else None
    w = (1 + 0.1 * torch.randn(H, generator=g)).to(DEV)
    out, r = fused_add_rms_norm(x, res, w, 1e-5)
    want_r = x + res if with_residual else x
    assert torch.equal(r, want_r)
    if not with_residual:
        assert r is x  # no copy when there is nothing to add
    torch.testing.assert_close(out, rms_norm(want_r, w, 1e-5), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("H,T", [(64, 5), (96, 5), (2880, 2)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rmsnorm_bf16(H: int, T: int, with_residual: bool) -> None:
    g = torch.Generator().manual_seed(H + T)
    x = (torch.randn(T, H, generator=g) * 4).bfloat16().to(DEV)
    res = (torch.randn(T, H, generator=g) * 4).bfloat16().to(DEV) if with_residual else None
    w = (1 + 0.1 * torch.randn(H, generator=g)).to(DEV)
    out, r = fused_add_rms_norm(x, res, w, 1e-5)
    want_r = x + res if with_residual else x
    assert torch.equal(r, want_r)  # the add rounds exactly like torch's bf16 add
    assert_within_ulp(out, rms_norm(want_r, w, 1e-5), max_ulp=1, min_exact=0.98)


@pytest.mark.parametrize("T,H", [(1, 96), (3, 2880)])
def test_rmsnorm_combine_is_moe_combine_then_add(T: int, H: int) -> None:
    """combine= (the decode path's fused MoE combine): the same bits as moe.combine, then the add."""
    from gptoss.kernels.moe import combine

    g = torch.Generator().manual_seed(T * H)
    k = 4
    y = (torch.randn(T * k, H, generator=g) * 3).bfloat16().to(DEV)
    wts = torch.softmax(torch.randn(T, k, generator=g), dim=1).to(DEV)
    res = (torch.randn(T, H, generator=g) * 3).bfloat16().to(DEV)
    w = (1 + 0.1 * torch.randn(H, generator=g)).to(DEV)
    out, r = fused_add_rms_norm(y, res, w, 1e-5, combine=wts)
    want_out, want_r = fused_add_rms_norm(combine(y, wts, y.dtype), res, w, 1e-5)
    assert r.shape == out.shape == (T, H)
    assert torch.equal(r, want_r)
    assert torch.equal(out, want_out)
    want = r"combine weights \(2, 4\) need a residual and x of \[T\*k, H\] rows"
    with pytest.raises(ValueError, match=want):
        fused_add_rms_norm(y[:4], res[:1], w, 1e-5, combine=torch.ones(2, k, device=DEV))
    with pytest.raises(ValueError, match="need a residual"):
        fused_add_rms_norm(y, None, w, 1e-5, combine=wts)


def test_rmsnorm_strided_rows_and_bad_weight() -> None:
    x = torch.randn(4, 160, device=DEV)[:, :96]  # row stride 160
    w = torch.ones(96, device=DEV)
    out, _ = fused_add_rms_norm(x, None, w, 1e-5)
    torch.testing.assert_close(out, rms_norm(x, w, 1e-5), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match=r"weight must be a contiguous \[96\]"):
        fused_add_rms_norm(x, None, torch.ones(95, device=DEV), 1e-5)


# -------------------------------------------------------------------------------------- RoPE


def rope_ref(qkv: torch.Tensor, positions: torch.Tensor, rope: Rope, hq: int, hkv: int, d: int):
    T = qkv.shape[0]
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=1)
    cos, sin = rope(positions)
    return (
        apply_rope(q.reshape(T, hq, d), cos, sin),
        apply_rope(k.reshape(T, hkv, d), cos, sin),
        v.reshape(T, hkv, d),
    )


@pytest.mark.parametrize("preset", ["tiny", "20b"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_qkv_matches_apply_rope(preset: str, dtype: torch.dtype) -> None:
    cfg = PRESETS[preset]
    hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    rope = Rope(cfg).to(DEV)
    cos_sin = build_cos_sin(rope, 5000)
    g = torch.Generator().manual_seed(1)
    T = 5
    qkv = (torch.randn(T, (hq + 2 * hkv) * d, generator=g) * 2).to(dtype).to(DEV)
    positions = torch.tensor([0, 1, 17, 4095, 4999], device=DEV)
    q, k, v = rope_qkv(qkv, positions, cos_sin, hq, hkv, d)
    wq, wk, wv = rope_ref(qkv, positions, rope, hq, hkv, d)
    assert q.is_contiguous() and q.shape == (T, hq, d) and k.shape == v.shape == (T, hkv, d)
    assert torch.equal(v, wv)
    for got, want in ((q, wq), (k, wk)):
        if INTERPRET:  # no FMA contraction on CPU: bit-exact
            assert torch.equal(got, want)
        elif dtype == torch.float32:
            torch.testing.assert_close(got, want, rtol=1e-6, atol=2e-6)
        else:
            assert_within_ulp(got, want, max_ulp=1, min_exact=0.99)


def test_cos_sin_table_is_the_reference_rope() -> None:
    rope = Rope(PRESETS["20b"])
    table = build_cos_sin(rope, 300)
    cos, sin = rope(torch.tensor([0, 7, 299]))
    assert table.shape == (300, 64) and table.dtype == torch.float32
    torch.testing.assert_close(table[[0, 7, 299]], torch.cat((cos, sin), -1), rtol=0, atol=1e-6)


def test_rope_qkv_writes_cache_and_skips_padding() -> None:
    cfg = PRESETS["tiny"]
    hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    rope = Rope(cfg).to(DEV)
    cos_sin = build_cos_sin(rope, 64)
    T, blocks, bs = 5, 4, 4
    qkv = torch.randn(T, (hq + 2 * hkv) * d, device=DEV).bfloat16()
    positions = torch.tensor([3, 4, 5, 0, 1], device=DEV)
    slots = torch.tensor([9, -1, 2, 15, -1], device=DEV)
    k_cache = torch.full((blocks, bs, hkv, d), 777.0, device=DEV).bfloat16()
    v_cache = torch.full((blocks, bs, hkv, d), -777.0, device=DEV).bfloat16()
    _, k, v = rope_qkv(qkv, positions, cos_sin, hq, hkv, d, k_cache, v_cache, slots)
    _, wk, _ = rope_ref(qkv, positions, rope, hq, hkv, d)
    assert_within_ulp(k, wk, max_ulp=1, min_exact=0.99)
    kf, vf = k_cache.view(-1, hkv, d), v_cache.view(-1, hkv, d)
    written = [s for s in slots.tolist() if s >= 0]
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            assert torch.equal(kf[s], k[t]) and torch.equal(vf[s], v[t])
    rest = [s for s in range(blocks * bs) if s not in written]
    assert bool((kf[rest] == 777).all()) and bool((vf[rest] == -777).all())


def test_rope_qkv_rejects_partial_cache_args() -> None:
    qkv = torch.randn(2, (4 + 4) * 64, device=DEV)
    cs = torch.zeros(8, 64, device=DEV)
    with pytest.raises(ValueError, match="give all of k_cache, v_cache and slot_mapping"):
        rope_qkv(
            qkv,
            torch.zeros(2, dtype=torch.int64, device=DEV),
            cs,
            4,
            2,
            64,
            k_cache=torch.zeros(1, 4, 2, 64, device=DEV),
        )


# ---------------------------------------------------------------------------------- Sampling


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
        monkeypatch.setattr(sampling, "_chunk_size", lambda b, v, c=chunk: c)
        got.append(sampling.gumbel_argmax(logits, p["temperature"], p["seeds"], p["offsets"]).tolist())
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


# ------------------------------------------------------------------------ GPU, full shapes


@gpu
def test_gpu_full_shapes() -> None:
    cfg = PRESETS["20b"]
    hq, hkv, d, H = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
    x = torch.randn(1024, H, device="cuda").bfloat16()
    res = torch.randn(1024, H, device="cuda").bfloat16()
    w = 1 + 0.1 * torch.randn(H, device="cuda")
    out, r = fused_add_rms_norm(x, res, w, 1e-5)
    assert torch.equal(r, x + res)
    assert_within_ulp(out, rms_norm(r, w, 1e-5), max_ulp=1, min_exact=0.98)
    rope = Rope(cfg).to("cuda")
    cos_sin = build_cos_sin(rope, 131072)
    qkv = torch.randn(512, (hq + 2 * hkv) * d, device="cuda").bfloat16()
    positions = torch.randint(0, 131072, (512,), device="cuda")
    q, k, v = rope_qkv(qkv, positions, cos_sin, hq, hkv, d)
    wq, wk, wv = rope_ref(qkv, positions, rope, hq, hkv, d)
    assert_within_ulp(q, wq, max_ulp=1, min_exact=0.99)
    assert_within_ulp(k, wk, max_ulp=1, min_exact=0.99)
    assert torch.equal(v, wv)
    logits = torch.randn(1024, 201088, device="cuda") * 3
    greedy = sample(logits, **params(1024, temperature=0.0), filtered=False)
    assert torch.equal(greedy, torch.argmax(logits, -1))
    drawn = sample(logits, **params(1024, top_k=50, top_p=0.9), filtered=True)
    assert bool((drawn >= 0).all())
    top50 = logits.topk(50, -1).indices
    assert bool((top50 == drawn[:, None]).any(-1).all())


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

"""qkv_rope (gptoss.kernels.qkv_rope) against the two launches it replaces: the QKV GEMV (linear.gemv,
the same float32 sums) and rope_qkv, including the cache writes; and against the torch reference
(F.linear in float64, then gptoss.model.apply_rope).

Interpreter on CPU (the tiny preset's heads, K 96 and 320: a masked K tail of one step and of the
third); compiled on a GPU, the 20b shapes at T 1..8. Tolerances: against the unfused kernels, bf16
within 1 ulp and >= 99 % bit-equal (the dots' sums may run in another order), float32 1e-6; against
the torch reference, what rounding q|k|v once more allows: bf16 1 ulp (>= 97 % exact), float32 1e-5.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gptoss.config import PRESETS
from gptoss.kernels.linear import gemv
from gptoss.kernels.qkv_rope import qkv_rope
from gptoss.kernels.rope import build_cos_sin, rope_qkv
from gptoss.model import Rope
from tests.gptoss.kernels.kernelkit import DEV, INTERPRETER_WARNINGS, gpu
from tests.gptoss.kernels.test_small_ops import assert_within_ulp, rope_ref

pytestmark = INTERPRETER_WARNINGS
BLOCKS, BS = 4, 4


def _case(preset: str, t: int, k: int, dtype: torch.dtype, seed: int):
    cfg = PRESETS[preset]
    hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    n = (hq + 2 * hkv) * d
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(t, k, generator=g) * 2).to(dtype).to(DEV)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(dtype).to(DEV)
    b = (torch.randn(n, generator=g) * 0.5).to(dtype).to(DEV)
    positions = torch.randint(0, 4000, (t,), generator=g).to(DEV)
    rope = Rope(cfg).to(DEV)
    return x, w, b, positions, rope, build_cos_sin(rope, 4000), (hq, hkv, d)


def _caches(hkv: int, d: int, dtype: torch.dtype):
    return (
        torch.full((BLOCKS, BS, hkv, d), 777.0, device=DEV).to(dtype),
        torch.full((BLOCKS, BS, hkv, d), -777.0, device=DEV).to(dtype),
    )


def _close(got: torch.Tensor, want: torch.Tensor, min_exact: float, atol: float) -> None:
    if got.dtype == torch.bfloat16:
        assert_within_ulp(got.contiguous(), want.contiguous(), max_ulp=1, min_exact=min_exact)
    else:
        torch.testing.assert_close(got, want, rtol=atol, atol=atol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t, k", [(1, 96), (3, 320), (8, 96)])
def test_equals_the_gemv_then_rope_qkv_with_its_cache_writes(dtype, t, k):
    x, w, b, positions, rope, cos_sin, (hq, hkv, d) = _case("tiny", t, k, dtype, seed=t * k)
    slots = torch.tensor([9, -1, 2, 15, 0, 5, 7, 11][:t], device=DEV)  # -1: a padding token, skipped
    kc, vc = _caches(hkv, d, dtype)
    q, k_, v = qkv_rope(x, w, b, positions, cos_sin, hq, hkv, d, kc, vc, slots)
    wkc, wvc = _caches(hkv, d, dtype)
    wq, wk, wv = rope_qkv(gemv(x, w, b), positions, cos_sin, hq, hkv, d, wkc, wvc, slots)
    assert q.shape == (t, hq, d) and k_.shape == v.shape == (t, hkv, d)
    # float32: the two paths sum K in different orders, and numpy's BLAS picks its order by CPU (an
    # AMD EPYC gave 1.6e-6 where the Intel machines gave < 1e-6)
    for got, want in ((q, wq), (k_, wk), (v, wv)):
        _close(got, want, min_exact=0.99, atol=5e-6)
    assert torch.equal(kc.view(-1, hkv, d)[slots[slots >= 0]], k_[slots >= 0])  # the kernel's own k, v
    assert torch.equal(vc.view(-1, hkv, d)[slots[slots >= 0]], v[slots >= 0])
    untouched = torch.ones(BLOCKS * BS, dtype=torch.bool, device=DEV)
    untouched[slots[slots >= 0]] = False
    assert bool((kc.view(-1, hkv, d)[untouched] == 777).all()) and bool(
        (vc.view(-1, hkv, d)[untouched] == -777).all()
    )
    # the torch reference: F.linear in float64, one rounding, then apply_rope
    qkv = F.linear(x.double(), w.double(), b.double()).to(dtype)
    rq, rk, rv = rope_ref(qkv, positions, rope, hq, hkv, d)
    for got, want in ((q, rq), (k_, rk), (v, rv)):
        _close(got, want, min_exact=0.97, atol=1e-5)


def test_without_a_cache_and_views_of_one_buffer():
    x, w, b, positions, _, cos_sin, (hq, hkv, d) = _case("tiny", 2, 96, torch.bfloat16, seed=5)
    q, k, v = qkv_rope(x, w, b, positions, cos_sin, hq, hkv, d)
    wq, wk, wv = rope_qkv(gemv(x, w, b), positions, cos_sin, hq, hkv, d)
    for got, want in ((q, wq), (k, wk), (v, wv)):
        _close(got, want, min_exact=0.99, atol=0)
    assert q.stride() == k.stride() == v.stride() == ((hq + 2 * hkv) * d, d, 1)  # paged_attention reads these


def test_argument_errors():
    x, w, b, positions, _, cos_sin, (hq, hkv, d) = _case("tiny", 2, 96, torch.float32, seed=1)
    kc, vc = _caches(hkv, d, torch.float32)
    with pytest.raises(ValueError, match=r"x must be \[T, K\] with T in \[1, 8\], got \(9, 96\)"):
        qkv_rope(x.repeat(5, 1)[:9], w, b, positions, cos_sin, hq, hkv, d)
    with pytest.raises(ValueError, match=r"w must be \[512, 96\] and b \[512\]"):
        qkv_rope(x, w[:-1], b, positions, cos_sin, hq, hkv, d)
    with pytest.raises(ValueError, match="must share bfloat16 or float32"):
        qkv_rope(x, w.bfloat16(), b, positions, cos_sin, hq, hkv, d)
    with pytest.raises(ValueError, match="head_dim must be a multiple of 32"):
        qkv_rope(
            x, w[: (hq + 2 * hkv) * 48], b[: (hq + 2 * hkv) * 48], positions, cos_sin[:, :48], hq, hkv, 48
        )
    with pytest.raises(ValueError, match=r"positions must be \[2\]"):
        qkv_rope(x, w, b, positions[:1], cos_sin, hq, hkv, d)
    with pytest.raises(ValueError, match="give all of k_cache, v_cache and slot_mapping"):
        qkv_rope(x, w, b, positions, cos_sin, hq, hkv, d, kc, vc)
    with pytest.raises(ValueError, match="caches must be two alike"):
        qkv_rope(
            x, w, b, positions, cos_sin, hq, hkv, d, kc, vc[:2], torch.zeros(2, dtype=torch.int64, device=DEV)
        )


@gpu
@pytest.mark.parametrize("t", [1, 2, 5, 8])
def test_20b_shapes_on_gpu(t):
    x, w, b, positions, rope, cos_sin, (hq, hkv, d) = _case("20b", t, 2880, torch.bfloat16, seed=t)
    slots = torch.arange(t, device=DEV) * 3 % (BLOCKS * BS)  # distinct slots inside the cache
    kc, vc = _caches(hkv, d, torch.bfloat16)
    q, k, v = qkv_rope(x, w, b, positions, cos_sin, hq, hkv, d, kc, vc, slots)
    wq, wk, wv = rope_qkv(gemv(x, w, b), positions, cos_sin, hq, hkv, d)
    for got, want in ((q, wq), (k, wk), (v, wv)):
        _close(got, want, min_exact=0.99, atol=0)
    assert torch.equal(kc.view(-1, hkv, d)[slots], k) and torch.equal(vc.view(-1, hkv, d)[slots], v)

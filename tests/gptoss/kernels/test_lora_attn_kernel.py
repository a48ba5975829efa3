"""lora_add (gptoss.kernels.lora_attn): an attention projection's LoRA delta in one launch, against the
float64 reference with the torch path's rounding points (the shrink rounded to the dtype, the 0/1 mask,
the expand added to out and rounded once).

Interpreter on CPU: K 200 (a masked tail of the BK 128 step), N 100 (a masked second column tile), the
single (W 16) and the stacked q/k/v (3W 48, the mask repeated) widths, T 1, 5 and 16; compiled on a
GPU, the 20b shapes. Tolerances: float32 1e-5; bf16 within one bf16 step plus the shrink roundings'
reach (_assert_within_rounding) and >= 90 % bit-equal (the sums run in another order than float64's;
compiled at T 16, stacked, the 1-ulp bound failed on an H100)."""

from __future__ import annotations

import pytest
import torch

from gptoss.kernels import lora_attn
from gptoss.kernels.lora_attn import lora_add
from tests.gptoss.kernels.kernelkit import DEV, INTERPRETER_WARNINGS, gpu

pytestmark = INTERPRETER_WARNINGS


def _case(t: int, k: int, n: int, w: int, reps: int, dtype: torch.dtype, seed: int = 0):
    """out, x, A [reps*w, k], B [n, reps*w], and a mask [t, w] mixing two adapters of rank w/2 and the
    base model (rows i % 3 == 2: no adapter; row 0 has adapter 1)."""
    g = torch.Generator().manual_seed(seed)
    out = torch.randn(t, n, generator=g).to(dtype).to(DEV)
    x = torch.randn(t, k, generator=g).to(dtype).to(DEV)
    a = (torch.randn(reps * w, k, generator=g) / k**0.5).to(dtype).to(DEV)
    b = (torch.randn(n, reps * w, generator=g) * 0.5).to(dtype).to(DEV)
    which = (torch.arange(t) + 1) % 3  # 0: base, 1: adapter 1, 2: adapter 2
    cols = torch.arange(w) // (w // 2) + 1
    mask = (cols[None, :] == which[:, None]).to(dtype).to(DEV)
    return out, x, a, b, mask


def _reference(out, x, a, b, mask) -> torch.Tensor:
    reps = a.shape[0] // mask.shape[1]
    u = (x.double() @ a.double().t()).to(x.dtype).double() * mask.repeat(1, reps).double()
    return (out.double() + u @ b.double().t()).to(out.dtype)


def _ulp(v: torch.Tensor) -> torch.Tensor:
    """One bf16 step at |v| (float64)."""
    _, e = torch.frexp(v.double().abs().clamp_min(2.0**-126))
    return torch.ldexp(torch.ones_like(v, dtype=torch.float64), e - 8)


def _assert_within_rounding(got, x, a, b, mask, want, min_exact: float = 0.9) -> None:
    """bf16: each value within one bf16 step of the reference plus what the shrink's roundings can
    move it (a shrink value summed in another order may land on its neighbouring bf16: |B| times that
    step, over the masked columns), and mostly bit-equal."""
    reps = a.shape[0] // mask.shape[1]
    u = (x.double() @ a.double().t()) * mask.repeat(1, reps).double()
    bound = _ulp(want) + _ulp(u) @ b.double().abs().t()
    assert ((got.double() - want.double()).abs() <= bound).all()
    assert (got == want).float().mean().item() >= min_exact


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reps", [1, 3])
@pytest.mark.parametrize("t", [1, 5, 16])
def test_lora_add_matches_the_reference(t: int, reps: int, dtype: torch.dtype) -> None:
    out, x, a, b, mask = _case(t, 200, 100, 16, reps, dtype)
    assert lora_attn.suits(x, a)
    want = _reference(out, x, a, b, mask)
    before = out.clone()
    lora_add(out, x, a, b, mask)
    if dtype == torch.float32:
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    else:
        _assert_within_rounding(out, x, a, b, mask, want)
    base = torch.arange(t, device=out.device) % 3 == 2
    # Tokens of the base model keep their projection bit for bit; adapted ones change.
    assert torch.equal(out[base], before[base])
    assert not torch.equal(out[~base], before[~base])


def test_a_mixed_batch_gives_each_row_what_it_gets_alone() -> None:
    out, x, a, b, mask = _case(5, 200, 100, 16, 3, torch.bfloat16, seed=1)
    together = out.clone()
    lora_add(together, x, a, b, mask)
    for i in range(5):
        alone = out[i : i + 1].clone()
        lora_add(alone, x[i : i + 1], a, b, mask[i : i + 1])
        assert torch.equal(alone, together[i : i + 1])


def test_sizes_past_the_kernel_take_the_torch_path_with_the_same_result() -> None:
    out, x, a, b, mask = _case(20, 200, 100, 16, 1, torch.float32)
    assert not lora_attn.suits(x, a)  # T 20 > MAX_T
    want = _reference(out, x, a, b, mask)
    lora_add(out, x, a, b, mask)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    wide = torch.zeros(lora_attn.MAX_W * 2, 200, device=DEV)
    assert not lora_attn.suits(x[:4], wide)


def test_a_width_that_is_not_a_multiple_of_the_mask_is_refused() -> None:
    out, x, a, b, mask = _case(2, 200, 100, 16, 1, torch.float32)
    with pytest.raises(ValueError, match="LoRA width 16 is not a multiple of the mask's 12"):
        lora_add(out, x, a, b, mask[:, :12])


@gpu
@pytest.mark.parametrize(("k", "n", "reps"), [(2880, 5120, 3), (4096, 2880, 1)])
@pytest.mark.parametrize("t", [1, 16])
def test_lora_add_at_the_20b_shapes(t: int, k: int, n: int, reps: int) -> None:
    """At K 2880 the float32 shrink and float64's round a few u to neighbouring bf16 values (seen on an
    H100: 1 u of 768 at T 16, 1.8 % of out then 1-2 ulp off, up to 2^-5 where the sum nears 0), so:
    >= 97 % bit-equal and within the shrink roundings' reach."""
    out, x, a, b, mask = _case(t, k, n, 16, reps, torch.bfloat16, seed=2)
    want = _reference(out, x, a, b, mask)
    lora_add(out, x, a, b, mask)
    _assert_within_rounding(out, x, a, b, mask, want, min_exact=0.97)

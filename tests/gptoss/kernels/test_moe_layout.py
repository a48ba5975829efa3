"""prepare_moe_weights converts its private copies in place (120b's layer-at-a-time peak on an 80 GB
H100, bench/results v22) and never writes the checkpoint tensors it is given."""

import pytest
import torch

from gptoss.kernels.moe_layout import _to_bits_layout, _to_v3_layout, prepare_moe_weights


def _checkpoint(e: int, h: int, i: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def u8(*shape: int, hi: int = 256) -> torch.Tensor:
        return torch.randint(0, hi, shape, generator=g, dtype=torch.uint8)

    return [
        u8(e, 2 * i, h // 32, 16),
        u8(e, 2 * i, h // 32, hi=129),
        torch.randn(e, 2 * i, generator=g),
        u8(e, h, i // 32, 16),
        u8(e, h, i // 32, hi=129),
        torch.randn(e, h, generator=g),
    ]


@pytest.mark.parametrize(
    ("kernels", "large"), [("v1", None), ("v2", None), ("v3", None), ("v3ds", None), ("v2", "v3")]
)
@pytest.mark.parametrize(("h", "i"), [(128, 64), (96, 96)])  # H 96: gate_up's K is padded (no in-place v3)
def test_prepare_leaves_the_checkpoint_tensors_unchanged(kernels, large, h, i):
    args = _checkpoint(3, h, i, seed=h + i)
    before = [a.clone() for a in args]
    w = prepare_moe_weights(*args, kernels=kernels, large=large)
    assert w.shape == (3, h, i)
    for name, a, b in zip(
        ("gate_up_blocks", "gate_up_scales", "gate_up_bias", "down_blocks", "down_scales", "down_bias"),
        args,
        before,
        strict=True,
    ):
        assert torch.equal(a, b), name


def test_v3_layout_in_place_equals_the_copy_and_refuses_another_shape():
    g = torch.Generator().manual_seed(3)
    blocks = torch.randint(0, 256, (2, 32, 64), generator=g, dtype=torch.uint8)  # K 128: no pad
    want = _to_v3_layout(blocks.clone())
    work = blocks.clone()
    got = _to_v3_layout(work, out=work)
    assert got.data_ptr() == work.data_ptr() and torch.equal(got, want)
    assert not torch.equal(want, blocks)  # the layout moved bytes: the in-place run had work to do
    with pytest.raises(ValueError, match=r"_to_v3_layout: out is \(2, 32, 40\), expected \(2, 32, 64\)"):
        _to_v3_layout(blocks[..., :40].contiguous(), out=blocks[..., :40].contiguous())


def test_bits_layout_in_place_equals_the_copy():
    g = torch.Generator().manual_seed(4)
    blocks = torch.randint(0, 256, (3, 2, 16, 8), generator=g, dtype=torch.uint8)
    want = _to_bits_layout(blocks)
    work = blocks.clone()
    assert torch.equal(_to_bits_layout(work, out=work), want) and torch.equal(work, want)

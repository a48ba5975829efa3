import pytest
import torch

from gptoss import mxfp4


def test_each_byte_holds_two_e2m1_values_low_nibble_first():
    blocks = torch.tensor([[0x71, 0xF8, 0x00, 0x9A] + [0] * 12], dtype=torch.uint8)  # [1, 16]
    scales = torch.tensor([127], dtype=torch.uint8)  # 2^0
    out = mxfp4.dequantize(blocks, scales, torch.float32)
    assert out.shape == (32,)
    # 0x71: low 1 -> 0.5, high 7 -> 6.0; 0xF8: low 8 -> -0.0, high 15 -> -6.0;
    # 0x9A: low 10 -> -1.0, high 9 -> -0.5
    assert out[:8].tolist() == [0.5, 6.0, -0.0, -6.0, 0.0, 0.0, -1.0, -0.5]
    assert torch.signbit(out[2]) and not torch.signbit(out[4])


@pytest.mark.parametrize("scale, factor", [(127, 1.0), (130, 8.0), (120, 2.0**-7), (118, 2.0**-9)])
def test_scale_is_a_power_of_two_biased_by_127(scale, factor):
    blocks = torch.full((2, 16), 0x77, dtype=torch.uint8)  # every value 6.0
    scales = torch.tensor([scale, 127], dtype=torch.uint8)
    out = mxfp4.dequantize(blocks, scales, torch.float32)
    assert out[:32].unique().tolist() == [6.0 * factor]
    assert out[32:].unique().tolist() == [6.0]


def test_all_256_bytes_and_shapes_match_transformers_independent_decoder():
    decoder = pytest.importorskip("transformers.integrations.mxfp4")
    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 10, 4, 16), generator=g, dtype=torch.uint8)  # [E, rows, K/32, 16]
    blocks[0, :4] = torch.arange(256, dtype=torch.uint8).view(4, 4, 16)  # every byte value once
    scales = torch.randint(110, 135, (3, 10, 4), generator=g, dtype=torch.uint8)
    ours = mxfp4.dequantize(blocks, scales, torch.bfloat16)  # [E, rows, K]
    theirs = decoder.convert_moe_packed_tensors(blocks, scales)  # [E, K, rows] bf16
    assert ours.shape == (3, 10, 128)
    assert torch.equal(ours, theirs.transpose(1, 2))


def test_dequantize_is_exact_in_bf16_and_fp32():
    g = torch.Generator().manual_seed(1)
    blocks = torch.randint(0, 256, (64, 2, 16), generator=g, dtype=torch.uint8)
    scales = torch.randint(100, 140, (64, 2), generator=g, dtype=torch.uint8)
    assert torch.equal(
        mxfp4.dequantize(blocks, scales, torch.bfloat16).float(),
        mxfp4.dequantize(blocks, scales, torch.float32),
    )


def test_quantize_round_trips_mxfp4_values_bit_exactly():
    g = torch.Generator().manual_seed(2)
    blocks = torch.randint(0, 256, (5, 7, 3, 16), generator=g, dtype=torch.uint8)
    # Each block's absmax must be the top code (+-6) for its scale to be the unique choice.
    blocks[..., 0] = (blocks[..., 0] & 0xF0) | 0x07
    scales = torch.randint(100, 140, (5, 7, 3), generator=g, dtype=torch.uint8)
    b2, s2 = mxfp4.quantize(mxfp4.dequantize(blocks, scales, torch.float32))
    assert torch.equal(b2, blocks)
    assert torch.equal(s2, scales)


def test_quantize_then_dequantize_preserves_any_mxfp4_tensor():
    g = torch.Generator().manual_seed(3)
    blocks = torch.randint(0, 256, (40, 4, 16), generator=g, dtype=torch.uint8)
    scales = torch.randint(115, 125, (40, 4), generator=g, dtype=torch.uint8)
    w = mxfp4.dequantize(blocks, scales, torch.float32)
    assert torch.equal(mxfp4.dequantize(*mxfp4.quantize(w), torch.float32), w)


def test_quantize_error_is_within_half_a_step():
    x = torch.randn(200, 64, generator=torch.Generator().manual_seed(4))
    blocks, scales = mxfp4.quantize(x)
    assert blocks.shape == (200, 2, 16) and scales.shape == (200, 2)
    y = mxfp4.dequantize(blocks, scales, torch.float32)
    step = torch.ldexp(torch.ones(scales.shape), scales.int() - 127).repeat_interleave(
        32, dim=-1
    )  # [200, 64]
    # e2m1 steps are at most 2 units (4 -> 6), so rounding is off by at most 1 unit of the scale;
    # and the scale is the smallest that fits the block, so it never clips.
    assert ((y - x).abs() <= step).all()
    assert (x.abs().unflatten(-1, (2, 32)).amax(-1) <= 6 * step[:, ::32]).all()
    assert mxfp4.quantize(torch.zeros(1, 32))[1].item() == 0  # all-zero block: smallest scale


def test_bad_inputs_are_refused_with_clear_errors():
    with pytest.raises(ValueError, match=r"mxfp4 blocks \(2, 3, 16\) do not match scales \(2, 4\)"):
        mxfp4.dequantize(torch.zeros(2, 3, 16, dtype=torch.uint8), torch.zeros(2, 4, dtype=torch.uint8))
    with pytest.raises(TypeError, match="mxfp4 blocks must be uint8, got torch.int32"):
        mxfp4.dequantize(torch.zeros(2, 16, dtype=torch.int32), torch.zeros(2, dtype=torch.uint8))
    with pytest.raises(TypeError, match="mxfp4 scales must be uint8, got torch.float32"):
        mxfp4.dequantize(torch.zeros(2, 16, dtype=torch.uint8), torch.zeros(2))
    with pytest.raises(ValueError, match="mxfp4 quantize: last dim 33 is not a multiple of 32"):
        mxfp4.quantize(torch.zeros(33))

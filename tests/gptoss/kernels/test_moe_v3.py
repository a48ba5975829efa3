"""The v3 MoE GEMMs (gptoss.kernels.moe_v3) in both weight layouts, "v3" (MMA lane fragments,
kernels="v3") and "v3ds" (checkpoint order, tl.dot_scaled), against the reference gptoss.model.MoE
and the v2 kernels.

Without CUDA the kernels run in Triton's interpreter, which runs no PTX and has no tl.dot_scaled
(Triton 3.6's interpreter builder lacks create_dot_scaled): "v3" runs its portable dequant (the
same rotate-and-mask registers as the PTX, by shifts), "v3ds" a stand-in (the same bytes through
v1's portable dequant and tl.dot). Every index, mask, K tail and epilogue is the compiled kernels';
the v3 PTX is the v2 PTX's instruction sequence (emulated in test_moe_kernel.py) with a second
factor; it and tl.dot_scaled run in the @gpu tests only. The v3 layout itself is checked by
decoding it in torch exactly as the kernel does and comparing with gptoss.mxfp4.dequantize.
Tolerances as test_moe_kernel.py's: bf16 1e-2 relative over the whole output (the reference rounds
x @ W13 to bf16 and runs SwiGLU in bf16, the kernels keep float32 until act), float32 1e-5; v3
against v2 (both exact dequant, float32 accumulation; summation order differs, act rounded to bf16)
1e-2 too.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated by triton.jit
pytest.importorskip("triton")

from gptoss.kernels import moe, moe_v3_dec_gu  # noqa: E402
from gptoss.kernels.moe import Tiles, moe_forward, prepare_moe_weights  # noqa: E402
from gptoss.kernels.moe_layout import MAX_SCALE_V2, _to_bits_layout, _to_v3_layout, _to_v3_scales  # noqa: E402
from gptoss.kernels.moe_routing import route_and_group  # noqa: E402
from gptoss.kernels.moe_tiles import choose_tiles_v3  # noqa: E402
from gptoss.kernels.moe_v3_step import _V3_ASM  # noqa: E402
from gptoss.mxfp4 import E2M1_VALUES, dequantize  # noqa: E402
from tests.gptoss.kernels.conftest import count_calls  # noqa: E402
from tests.gptoss.kernels.moekit import (  # noqa: E402, F401 - the fixtures apply here too
    ALPHA,
    DEV,
    LIMIT,
    check_against_reference,
    e2m1,
    gpu,
    interpreter_like_the_gpu,
    make_moe,
    poisoned_buffers,
    pytestmark,
    reference,
    run_ptx,
)

TOL = 1e-2


@pytest.fixture(params=["v3", "v3ds"])
def kernels(request) -> str:
    return request.param


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    assert not got.isnan().any()
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def decode_v3(w: torch.Tensor, s: torch.Tensor, k: int) -> torch.Tensor:
    """The kernel's reading of one plane in the v3 layout, in torch: w [N, Kp/2], s [N, Kp/32] uint8
    -> W [N, K] float32 (regs j of word (rb, kc, g, t, s) = row 16 rb + 8 (j % 2) + g, K 64 kc +
    16 s + 8 (j // 2) + 2t + nib; v2's rotate-and-mask, then e2m1 bits at 15 and 8:6)."""
    n, kp = w.shape[0], w.shape[1] * 2
    kc = kp // 64
    words = w.reshape(n // 16, -1).view(torch.int32).long() & 0xFFFFFFFF  # [RB, KC*128]
    words = words.reshape(n // 16, kc, 8, 4, 4)  # rb, kc, g, t, s
    rot = lambda v, r: ((v << r) | (v >> (32 - r))) & 0xFFFFFFFF  # noqa: E731
    regs = [
        rot(words, 4) & 0x81C081C0,
        rot(words, 10) & 0x81C081C0,
        rot(words, 14) & 0x81C081C0,
        (words & 0x80C080C0) | ((words << 8) & 0x01000100),
    ]
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=w.device)
    sw = s.reshape(-1).view(torch.int32).long().reshape(n // 16, kc, 8) & 0xFFFFFFFF  # rb, kc, g
    out = torch.empty(n // 16, 2, 8, kc, 4, 2, 4, 2, device=w.device)  # rb, h, g, kc, s, q, t, nib
    for j, reg in enumerate(regs):
        q, h = divmod(j, 2)
        for nib in (0, 1):
            half = (reg >> (16 * nib)) & 0xFFFF
            code = ((half >> 6) & 7) | (((half >> 15) & 1) << 3)
            sc = torch.stack([(sw >> (8 * (2 * s2 + h))) & 0xFF for s2 in (0, 0, 1, 1)], -1)  # [.., s]
            val = lut[code] * torch.exp2(sc[:, :, :, None, :].float() - 127)  # [rb, kc, g, t, s]
            out[:, h, :, :, :, q, :, nib] = val.permute(0, 2, 1, 4, 3)  # -> rb, g, kc, s, t
    return out.reshape(n, kp)[:, :k]


def test_v3_layout_decodes_to_the_checkpoint_values():
    """N 48 (3 row blocks), K 160 (padded to 192: a half chunk of zeros), every byte and scale."""
    g = torch.Generator().manual_seed(1)
    blocks = torch.randint(0, 256, (2, 48, 5, 16), generator=g, dtype=torch.uint8)  # E, N, K/32, 16
    scales = torch.randint(100, 129, (2, 48, 5), generator=g, dtype=torch.uint8)
    w = _to_v3_layout(blocks.reshape(2, 48, 80))
    s = _to_v3_scales(scales)
    assert w.shape == (2, 48, 96) and s.shape == (2, 48, 6)
    for e in range(2):
        want = dequantize(blocks[e], scales[e], torch.float32)  # [48, 160]
        assert torch.equal(decode_v3(w[e], s[e], 160), want)
        assert not decode_v3(w[e], s[e], 192)[:, 160:].any()  # the pad decodes to zeros


def test_v3_ptx_dequant_gives_exact_mxfp4_values_with_a_factor_per_row():
    """_V3_ASM emulated instruction by instruction (moekit's run_ptx): a word in v2's bits
    order + the factors of rows g (registers 0, 2) and g + 8 (1, 3) -> e2m1 * 2^(s - 127) exactly."""
    g = torch.Generator().manual_seed(2)
    blocks = torch.randint(0, 256, (512, 4), dtype=torch.uint8, generator=g)  # byte j: register j
    s = torch.randint(0, MAX_SCALE_V2 + 1, (512, 2), dtype=torch.int64, generator=g)
    s[:3] = torch.tensor([[0, MAX_SCALE_V2], [1, 127], [MAX_SCALE_V2, 0]])  # the range's edges
    words = _to_bits_layout(blocks).view(torch.int32).numpy().view(np.uint32)[:, 0]
    f0, f1 = ((s.numpy()[:, h] * 0x800080 + 0x3F003F00).astype(np.uint32) for h in (0, 1))
    regs = run_ptx(_V3_ASM.value, [words, f0, f1], 4)
    got = np.stack([np.stack([(r & 0xFFFF) << 16, r & 0xFFFF0000], -1) for r in regs], 1)  # [512, 4, 2]
    got = torch.from_numpy(got.astype(np.uint32).view(np.float32).astype(np.float64))
    codes = torch.stack([blocks & 15, blocks >> 4], -1)  # [512, 4, 2]
    want = e2m1(codes) * torch.exp2(s.double() - 127)[:, [0, 1, 0, 1], None]
    assert torch.equal(got, want)


def _interleaved(planes: torch.Tensor) -> torch.Tensor:
    """[E, 2, I, X] -> [E, 2I, X] with row 16b + 8h + g = planes[:, h, 8b + g], built row by row."""
    e, _, i, _ = planes.shape
    out = torch.empty(e, 2 * i, planes.shape[-1], dtype=planes.dtype, device=planes.device)
    for row in range(2 * i):
        out[:, row] = planes[:, (row // 8) % 2, (row // 16) * 8 + row % 8]
    return out


def test_prepare_v3_and_v3ds_layouts():
    """v3ds: the checkpoint's nibble order (v1's bytes), gate_up's rows interleaved by 8; v3: the same
    rows in lane-fragment order. Biases and down as v1's."""
    ref, w = make_moe(4, 64, 96, 2, torch.bfloat16, seed=11, kernels="v3ds")
    _, w1 = make_moe(4, 64, 96, 2, torch.bfloat16, seed=11, kernels="v1")
    assert w.layout == "v3ds" and w.shape == (4, 64, 96)
    assert torch.equal(w.w13, _interleaved(w1.w13))
    assert torch.equal(w.s13[..., :2], _interleaved(w1.s13[..., :2]))  # H 64: 2 scale bytes a row
    for name in ("b13", "w2", "s2", "b2"):
        assert torch.equal(getattr(w, name), getattr(w1, name)), name
    _, w3 = make_moe(4, 64, 96, 2, torch.bfloat16, seed=11, kernels="v3")
    assert w3.layout == "v3" and w3.shape == (4, 64, 96)
    assert w3.w13.shape == (4, 192, 32) and w3.s13.shape == (4, 192, 2)  # H 64: one chunk
    assert w3.w2.shape == (4, 64, 64) and w3.s2.shape == (4, 64, 4)  # I 96 -> 128
    assert torch.equal(w3.w2[1], _to_v3_layout(w1.w2[1:2])[0])
    assert torch.equal(w3.w13, _to_v3_layout(_interleaved(w1.w13)))
    assert torch.equal(w3.s13, _to_v3_scales(_interleaved(w1.s13[..., :2])))


def test_prepare_rejects_unknown_kernels_and_v3_scales_above_128():
    with pytest.raises(ValueError, match="kernels must be 'v1' or 'v2' or 'v3' or 'v3ds', got 'v4'"):
        make_moe(4, 64, 64, 2, torch.bfloat16, seed=0, kernels="v4")
    e, h, i = 2, 64, 64
    args = [
        torch.zeros(e, 2 * i, h // 32, 16, dtype=torch.uint8),
        torch.full((e, 2 * i, h // 32), 129, dtype=torch.uint8),
        torch.zeros(e, 2 * i),
        torch.zeros(e, h, i // 32, 16, dtype=torch.uint8),
        torch.full((e, h, i // 32), 127, dtype=torch.uint8),
        torch.zeros(e, h),
    ]
    with pytest.raises(ValueError, match="scale byte 129 > 128.*the v3 kernels"):
        prepare_moe_weights(*args, kernels="v3")
    assert prepare_moe_weights(*args, kernels="v3ds").layout == "v3ds"


@pytest.mark.parametrize("tokens", [1, 5, 64, 130])
def test_v3_forward_matches_reference(tokens, kernels):
    ref, w = make_moe(8, 64, 64, 4, torch.bfloat16, seed=tokens, kernels=kernels)
    check_against_reference(ref, w, (torch.randn(tokens, 64, device=DEV) * 3).bfloat16())


def test_v3_matches_v2_on_the_same_checkpoint(kernels):
    ref, w3 = make_moe(8, 96, 64, 4, torch.bfloat16, seed=21, kernels=kernels)
    _, w2 = make_moe(8, 96, 64, 4, torch.bfloat16, seed=21, kernels="v2")
    x = (torch.randn(20, 96, device=DEV) * 3).bfloat16()
    got = moe_forward(x, ref.router_weight, ref.router_bias, 4, w3, ALPHA, LIMIT)
    want = moe_forward(x, ref.router_weight, ref.router_bias, 4, w2, ALPHA, LIMIT)
    assert _rel(got, want) <= TOL


def test_v3_an_expert_with_every_token_and_one_with_none(kernels):
    ref, w = make_moe(8, 64, 64, 4, torch.bfloat16, seed=4, kernels=kernels)
    ref.router_bias[0] = 50.0  # expert 0 wins every token
    ref.router_bias[5] = -50.0  # expert 5 never makes the top 4
    x = (torch.randn(40, 64, device=DEV) * 3).bfloat16()
    r = route_and_group(F.linear(x, ref.router_weight, ref.router_bias), 4)
    assert r.counts[0].item() == 40 and r.counts[5].item() == 0
    check_against_reference(ref, w, x)


@pytest.mark.parametrize(
    "tiles",
    [
        Tiles(16, 64, 128, 4, 3),  # K 160: 128 + a tail (v3: padded to 192, a masked 64 chunk)
        Tiles(32, 64, 64, 4, 2),  # K 160: two whole steps and a half one (v3: none, 192 = 3 x 64)
        Tiles(64, 128, 128, 8, 3),  # N 96: one partial N tile
        Tiles(16, 32, 256, 4, 2),  # one step past both Ks; v3: BN 32 = 2 row blocks
        Tiles(32, 64, 64, 4, 2, half=True),  # ~6 rows an expert: every tile takes the BM/2 body
        Tiles(16, 32, 128, 4, 6),  # 64 weight rows (the decode bucket's gate_up), more stages than steps
        Tiles(32, 64, 128, 4, 3, half=True, maxnreg=128),  # a register cap (ptxas'; the interpreter's none)
    ],
)
def test_every_v3_tile_shape_with_k_and_n_tails(tiles, kernels):
    """H = 160 (gate_up's K), I = 96 (down's K, and N of gate_up)."""
    ref, w = make_moe(8, 160, 96, 4, torch.bfloat16, seed=7, kernels=kernels)
    x = (torch.randn(12, 160, device=DEV) * 3).bfloat16()
    r = route_and_group(F.linear(x, ref.router_weight, ref.router_bias), 4)
    y = moe.down_v3(moe.gate_up_v3(x, r, w, ALPHA, LIMIT, tiles), r, w, tiles)  # [T*k, H]
    assert y.shape == (48, 160)
    assert _rel(moe.combine(y, r.weights, x.dtype), reference(ref, x)) <= TOL


@pytest.mark.parametrize("bm", [32, 64])
def test_v3_half_tiles_with_full_and_short_tiles(bm, kernels):
    """Tiles.half: expert 0 has every token (40 rows: a full tile, then 8 rows at BM 32; one tile of
    40 > 32 rows at BM 64), the others a few: the BM/2 body for short tiles, the BM one for the rest."""
    ref, w = make_moe(16, 160, 96, 4, torch.bfloat16, seed=12, kernels=kernels)
    ref.router_bias[0] = 50.0
    x = (torch.randn(40, 160, generator=torch.Generator().manual_seed(5)) * 3).to(DEV).bfloat16()
    r = route_and_group(F.linear(x, ref.router_weight, ref.router_bias), 4)
    assert r.counts[0].item() == 40 and 0 < r.counts[1:].max().item() <= bm // 2
    t = Tiles(bm, 64, 64, 4, 2, half=True)
    act = moe.gate_up_v3(x, r, w, ALPHA, LIMIT, t)
    full = moe.gate_up_v3(x, r, w, ALPHA, LIMIT, Tiles(bm, 64, 64, 4, 2))
    assert _rel(act, full) <= 1e-6  # the same sums, row by row; only the MMA width differs
    y = moe.down_v3(act, r, w, t)
    assert _rel(y, moe.down_v3(act, r, w, Tiles(bm, 64, 64, 4, 2))) <= 1e-6
    assert _rel(moe.combine(y, r.weights, x.dtype), reference(ref, x)) <= TOL


def test_v3ds_takes_bk_32():
    ref, w = make_moe(8, 160, 96, 4, torch.bfloat16, seed=7, kernels="v3ds")
    x = (torch.randn(12, 160, device=DEV) * 3).bfloat16()
    r = route_and_group(F.linear(x, ref.router_weight, ref.router_bias), 4)
    t = Tiles(16, 64, 32, 4, 2)
    y = moe.down_v3(moe.gate_up_v3(x, r, w, ALPHA, LIMIT, t), r, w, t)
    assert _rel(moe.combine(y, r.weights, x.dtype), reference(ref, x)) <= TOL


def test_v3_gate_up_rows_are_in_assignment_order(kernels):
    """act row a = t*k + j is token t's j-th expert, as v2 writes it (combine relies on it)."""
    ref, w3 = make_moe(8, 64, 64, 4, torch.bfloat16, seed=8, kernels=kernels)
    _, w2 = make_moe(8, 64, 64, 4, torch.bfloat16, seed=8, kernels="v2")
    x = (torch.randn(9, 64, device=DEV) * 3).bfloat16()
    r = route_and_group(F.linear(x, ref.router_weight, ref.router_bias), 4)
    a3 = moe.gate_up_v3(x, r, w3, ALPHA, LIMIT, choose_tiles_v3(9, 4, 8, 64, 64, gate_up=True))
    a2 = moe.gate_up_v2(x, r, w2, ALPHA, LIMIT, moe.choose_tiles_v2(9, 4, 8, 64, 64, gate_up=True))
    assert a3.shape == (36, 64)
    for row in range(36):  # row by row: a swap of two rows would pass a whole-tensor norm
        assert _rel(a3[row], a2[row]) <= 2e-2, row


def test_v3_in_float32_matches_reference_closely(kernels):
    """float32 (exact greedy tests): the exact dequant, IEEE dots; only the summation order differs."""
    ref, w = make_moe(8, 96, 64, 4, torch.float32, seed=9, kernels=kernels)
    x = torch.randn(12, 96, device=DEV) * 3
    got = moe_forward(x, ref.router_weight, ref.router_bias, 4, w, ALPHA, LIMIT)
    assert got.dtype == torch.float32 and _rel(got, reference(ref, x)) <= 1e-5


def test_v3_rejects_other_activations_and_layouts():
    ref, w = make_moe(4, 64, 64, 2, torch.bfloat16, seed=0, kernels="v3")
    x = torch.randn(3, 64, device=DEV)
    r = route_and_group(F.linear(x.bfloat16(), ref.router_weight, ref.router_bias), 2)
    with pytest.raises(
        ValueError, match="v3 MoE kernels take bfloat16 or float32 activations, got torch.float16"
    ):
        moe.gate_up_v3(x.half(), r, w, ALPHA, LIMIT, Tiles(16, 64, 64, 4, 2))
    _, w2 = make_moe(4, 64, 64, 2, torch.bfloat16, seed=0, kernels="v2")
    with pytest.raises(ValueError, match="prepared with kernels='v3' or 'v3ds', got 'bits'"):
        moe.gate_up_v3(x.bfloat16(), r, w2, ALPHA, LIMIT, Tiles(16, 64, 64, 4, 2))
    with pytest.raises(ValueError, match="expert_rows_v3: weights in the 'bits' layout, not v3 or v3ds"):
        moe.expert_rows_v3(x.bfloat16(), r, w2, ALPHA, LIMIT)


def test_v3_decode_batches_leave_the_combine_to_the_caller(kernels):
    """moe.v3_decode: T <= 16 on a v3 copy (the engine then fuses routing and combine around
    expert_rows_v3); expert_rows_v3's rows combine to moe_forward's output."""
    ref, w = make_moe(8, 160, 96, 4, torch.bfloat16, seed=3, kernels=kernels)
    _, w2 = make_moe(8, 160, 96, 4, torch.bfloat16, seed=3, kernels="v2")
    x = (torch.randn(17, 160, device=DEV) * 3).bfloat16()
    assert [moe.v3_decode(x[:t], w) for t in (0, 1, 16, 17)] == [False, True, True, False]
    assert not moe.v3_decode(x[:1], w2)
    r = route_and_group(F.linear(x[:5], ref.router_weight, ref.router_bias), 4)
    y = moe.expert_rows_v3(x[:5], r, w, ALPHA, LIMIT)
    assert y.shape == (20, 160)
    want = moe_forward(x[:5], ref.router_weight, ref.router_bias, 4, w, ALPHA, LIMIT)
    assert torch.equal(moe.combine(y, r.weights, x.dtype), want)


@pytest.mark.parametrize("tokens", [1, 5, 8, 16])
def test_v3_gate_up_routing_the_logits_itself_matches_the_routing_kernel(tokens, kernels):
    """expert_rows_v3_logits: the gate_up kernel routes the logits in registers (ROUTE) and its
    program (0, 0) stores the routing; same rows out, same decisions as route_and_group (each
    expert's rows in increasing order, as the decode kernels store them). Past 8 tokens the split-K
    gate_up's x tile (8 rows) is shorter than the batch: route_and_group's own launch fills the
    routing, each expert's rows in the order its atomics gave (on a GPU, not one order)."""
    ref, w = make_moe(8, 160, 96, 4, torch.bfloat16, seed=3, kernels=kernels)
    x = (torch.randn(tokens, 160, device=DEV, generator=torch.Generator(DEV).manual_seed(4)) * 3).bfloat16()
    logits = F.linear(x, ref.router_weight, ref.router_bias)
    r = route_and_group(logits, 4)
    y, got = moe.expert_rows_v3_logits(x, logits, 4, w, ALPHA, LIMIT)
    assert torch.equal(y, moe.expert_rows_v3(x, r, w, ALPHA, LIMIT))
    assert torch.equal(got.ids, r.ids) and torch.equal(got.weights, r.weights)
    assert torch.equal(got.counts, r.counts) and int(got.counts.sum()) == 4 * tokens
    by_launch = tokens > moe_v3_dec_gu.V3_GATE_UP_DEC_BIG.bm and kernels == "v3"
    for e, c in enumerate(r.counts.tolist()):
        rows = got.rows[e, :c].tolist()
        assert (sorted(rows) if by_launch else rows) == sorted(r.rows[e, :c].tolist())


@pytest.mark.parametrize("tokens", [1, 5])
def test_v3_gate_up_routing_the_logits_gives_the_same_bits_with_pdl(tokens, monkeypatch):
    """moe_v3.ROUTE_PDL launches the routing gate_up with PDL (compiled on Hopper; elsewhere the
    constexpr branch is off): the same act, routing and rows as without it. (One token takes the
    split-K gate_up by default: an empty moe_v3_dec_gu.TOKENS keeps it on v3's.)"""
    from gptoss.kernels import moe_v3, moe_v3_dec_gu, pdl

    monkeypatch.setattr(moe_v3_dec_gu, "TOKENS", frozenset())
    ran = count_calls(monkeypatch, [(moe, "gate_up_v3", "v3")])

    ref, w = make_moe(8, 160, 96, 4, torch.bfloat16, seed=3, kernels="v3")
    x = (torch.randn(tokens, 160, device=DEV, generator=torch.Generator(DEV).manual_seed(4)) * 3).bfloat16()
    logits = F.linear(x, ref.router_weight, ref.router_bias)
    monkeypatch.setattr(moe_v3, "ROUTE_PDL", False)
    want, r0 = moe.expert_rows_v3_logits(x, logits, 4, w, ALPHA, LIMIT)
    monkeypatch.setattr(moe_v3, "ROUTE_PDL", True)
    got, r1 = moe.expert_rows_v3_logits(x, logits, 4, w, ALPHA, LIMIT)
    assert pdl.args(x)["PDL"] == pdl.on(x) and ran["v3"] == 2
    assert torch.equal(got, want) and torch.equal(r1.ids, r0.ids) and torch.equal(r1.counts, r0.counts)
    assert torch.equal(r1.weights, r0.weights)
    for e, c in enumerate(r0.counts.tolist()):  # the slots past an expert's count are never written
        assert r1.rows[e, :c].tolist() == r0.rows[e, :c].tolist()


def test_v3_gate_up_routes_in_the_kernel_only_one_tile_an_expert():
    ref, w = make_moe(8, 160, 96, 4, torch.bfloat16, seed=3, kernels="v3")
    x = torch.randn(17, 160, device=DEV).bfloat16()
    logits = F.linear(x, ref.router_weight, ref.router_bias)
    r = route_and_group(logits, 4)
    with pytest.raises(ValueError, match=r"one tile an expert \(T 17 <= BM 16\), rows in assignment order"):
        moe.gate_up_v3(x, r, w, ALPHA, LIMIT, Tiles(16, 32, 64, 4, 2), logits=logits)
    with pytest.raises(ValueError, match="logits \\(17, 4\\) must be \\[T, E\\] rows"):
        moe.gate_up_v3(x, r, w, ALPHA, LIMIT, Tiles(32, 32, 64, 4, 2), logits=logits[:, :4])


def test_v3_with_lora_adapters_matches_the_reference(kernels):
    """moe_forward_lora on v3 weights: the LoRA expand lands in the v3 kernels' epilogue."""
    from tests.gptoss.kernels.test_moe_lora_kernel import adapter, check, stack_of

    ref, w = make_moe(8, 64, 64, 4, torch.bfloat16, seed=11, kernels=kernels)
    stack = stack_of([adapter("a", 4, 1), adapter("b", 8, 2)], torch.bfloat16)
    x = (torch.randn(17, 64, generator=torch.Generator().manual_seed(3)) * 3).to(DEV, torch.bfloat16)
    index = torch.tensor([0, 1, 2] * 5 + [2, 1], device=DEV)
    got = check(ref, w, stack, x, index)
    base = moe_forward(x, ref.router_weight, ref.router_bias, ref.top_k, w, ALPHA, LIMIT)
    assert torch.equal(got[index == 0], base[index == 0])
    assert (got[index != 0].float() - base[index != 0].float()).norm() / base[
        index != 0
    ].float().norm() > 0.05


@gpu
@pytest.mark.parametrize("tokens", [1, 64, 256, 1024, 4096])
def test_v3_20b_shape_on_gpu_matches_v2(tokens, kernels):
    """The compiled PTX / dot_scaled paths at the real shapes (H = I = 2880: K tails for BK 128)."""
    ref, w3 = make_moe(32, 2880, 2880, 4, torch.bfloat16, seed=tokens, kernels=kernels)
    _, w2 = make_moe(32, 2880, 2880, 4, torch.bfloat16, seed=tokens, kernels="v2")
    x = torch.randn(tokens, 2880, device=DEV).bfloat16()
    got = moe_forward(x, ref.router_weight, ref.router_bias, 4, w3, ALPHA, LIMIT)
    want = moe_forward(x, ref.router_weight, ref.router_bias, 4, w2, ALPHA, LIMIT)
    assert _rel(got, want) <= TOL
    if tokens <= 64:
        check_against_reference(ref, w3, x)

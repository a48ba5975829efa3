"""The split-K decode GEMMs with the e8m0 scales applied after the MMA (moe_v3_dec.PSCALE,
gptoss.kernels.moe_v3_pscale): the down and the gate_up against the float64 reference and against
the same kernels scaling each weight (PSCALE off), and the scale factors a word's bytes give.

A scale applied to the wrong row or 32-K group shows: make_moe's scale bytes take 5 values (factors
1-16x apart) over rows and groups. Tolerances as test_moe_v3_dec*.py (bf16 only: PSCALE is off for
float32 x). Without CUDA the portable path runs in the interpreter; the @gpu tests run the PTX.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated by triton.jit
pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from gptoss.kernels import moe_v3_dec, moe_v3_dec_gu, moe_v3_pscale  # noqa: E402
from gptoss.kernels.moe_tiles import DecTiles  # noqa: E402
from tests.gptoss.kernels import test_moe_v3_dec as dn  # noqa: E402
from tests.gptoss.kernels import test_moe_v3_dec_gu as gu  # noqa: E402
from tests.gptoss.kernels.conftest import record_launches  # noqa: E402
from tests.gptoss.kernels.moekit import (  # noqa: E402, F401 - the fixtures apply here too
    ALPHA,
    DEV,
    LIMIT,
    TOL,
    gpu,
    interpreter_like_the_gpu,
    pytestmark,
)

BF16 = torch.bfloat16
SAME = 5e-3  # against the same kernel scaling each weight: float32 sums in another order, rounded to bf16


def _down(act, r, w, tiles, ps: bool, monkeypatch) -> torch.Tensor:
    monkeypatch.setattr(moe_v3_dec, "PSCALE", ps)
    return moe_v3_dec.down_v3_dec(act, r, w, tiles)


def _gate_up(x, r, w, tiles, ps: bool, monkeypatch) -> torch.Tensor:
    monkeypatch.setattr(moe_v3_dec, "PSCALE", ps)
    return moe_v3_dec_gu.gate_up_v3_dec(x, r, w, ALPHA, LIMIT, tiles)


@pytest.mark.parametrize(
    "tokens, e, h, i, k, tiles",
    [
        (1, 4, 128, 128, 2, None),  # one 128-K step over 2 warps: 2 groups a warp
        (3, 8, 160, 160, 4, None),  # K 160 -> 192: the last chunk masked
        (16, 8, 160, 160, 4, None),  # BM 16
        (5, 4, 128, 2880, 2, DecTiles(8, 64, 512, 4, 4, 3)),  # the big tiles; K = I 2880: a tail of 5 chunks
        (2, 4, 192, 96, 2, DecTiles(2, 16, 256, 1, 1, 2)),  # no split: 8 groups a warp, BN 16
    ],
)
def test_down_with_the_scales_after_the_mma(tokens, e, h, i, k, tiles, monkeypatch):
    ref, w, r, act = dn._case(e, h, i, k, tokens, BF16, seed=tokens)
    launches = record_launches(monkeypatch, moe_v3_dec, "_down_v3_dec_kernel", "PSCALE")
    got = _down(act, r, w, tiles, True, monkeypatch)
    assert launches == [True]
    assert got.shape == (tokens * k, h) and got.dtype == BF16
    assert dn._rel(got, dn._want(ref, r, act)) <= TOL[BF16]
    assert dn._rel(got, _down(act, r, w, tiles, False, monkeypatch)) <= SAME


@pytest.mark.parametrize(
    "tokens, e, h, i, k, tiles",
    [
        (1, 8, 128, 96, 4, None),  # the default tiles: 2 warps of one chunk
        (3, 8, 160, 96, 4, None),  # a masked chunk
        (16, 8, 256, 64, 4, None),  # BM 16
        (5, 4, 2880, 96, 2, DecTiles(8, 64, 256, 4, 4, 3)),  # the big tiles, K 2880
        (2, 4, 256, 64, 2, DecTiles(16, 32, 512, 2, 2, 3)),  # 2 chunks a warp: 4 groups
    ],
)
def test_gate_up_with_the_scales_after_the_mma(tokens, e, h, i, k, tiles, monkeypatch):
    ref, w, x, _, r = gu._case(e, h, i, k, tokens, BF16, seed=tokens)
    launches = record_launches(monkeypatch, moe_v3_dec_gu, "_gate_up_v3_dec_kernel", "PSCALE")
    got = _gate_up(x, r, w, tiles, True, monkeypatch)
    assert launches == [True]
    assert got.shape == (tokens * k, i) and got.dtype == BF16
    assert gu._rel(got, gu._want(ref, r, x)) <= TOL[BF16]
    assert gu._rel(got, _gate_up(x, r, w, tiles, False, monkeypatch)) <= SAME


def test_float32_inputs_keep_the_scale_on_each_weight(monkeypatch):
    """PSCALE multiplies x by 2^64 in bf16 and reads the words as bf16 subnormals: float32 x (tf32
    or IEEE dots) stays on the per-weight scale."""
    ref, w, r, act = dn._case(4, 128, 128, 2, 1, torch.float32, seed=1)
    launches = record_launches(monkeypatch, moe_v3_dec, "_down_v3_dec_kernel", "PSCALE")
    got = _down(act, r, w, None, True, monkeypatch)
    assert launches == [False]
    assert dn._rel(got, dn._want(ref, r, act)) <= TOL[torch.float32]


@triton.jit
def _factors_kernel(s_ptr, out_ptr, ASM: tl.constexpr):
    s = tl.load(s_ptr + tl.arange(0, 16))  # [SPLIT 1 * RB 2, KCS 1, 8] words
    f = moe_v3_pscale._group_scales(tl.reshape(s, (2, 1, 8)), 1, 2, 1, ASM)  # [2 groups, 32 rows, 1]
    tl.store(out_ptr + tl.arange(0, 64), tl.reshape(f, (64,)))


@pytest.mark.parametrize("asm", [False, pytest.param(True, marks=gpu)])
def test_each_scale_byte_gives_its_row_and_group_a_factor_of_2_to_the_s_minus_65(asm):
    """Bytes 0..127 and 128 (MAX_SCALE_V2) in words [rb, g] (byte 2 s2 + h: row 16 rb + 8h + g,
    group s2) -> factor [s2, row] = 2^(byte - 1 - XS), exactly: 2^-65 for byte 0, 2^63 for 128."""
    b = torch.arange(64, dtype=torch.int64) * 2 + torch.tensor([0, 1] * 32)  # 64 distinct bytes
    b[-1] = 128
    b = b.reshape(2, 8, 2, 2)  # [rb, g, s2, h]
    words = (b[..., 0, 0] | b[..., 0, 1] << 8 | b[..., 1, 0] << 16 | b[..., 1, 1] << 24).to(torch.int32)
    out = torch.empty(64, dtype=torch.float32, device=DEV)
    _factors_kernel[(1,)](words.reshape(-1).to(DEV), out, ASM=asm)
    want = torch.exp2(b.double().permute(2, 0, 3, 1).reshape(64) - 1 - moe_v3_pscale.XS)  # [s2, rb, h, g]
    assert torch.equal(out.cpu().double(), want)


@gpu
@pytest.mark.parametrize("tokens", [1, 4, 16])
def test_both_gemms_at_120b_shapes_on_gpu(tokens, monkeypatch):
    """The PTX (words as bf16 subnormals, x times 2^64, factors by prmt and mad) at full shapes."""
    ref, w, r, act = dn._case(8, 2880, 2880, 4, tokens, BF16, seed=tokens)
    assert dn._rel(_down(act, r, w, None, True, monkeypatch), dn._want(ref, r, act)) <= TOL[BF16]
    ref, w, x, _, r = gu._case(8, 2880, 2880, 4, tokens, BF16, seed=tokens)
    assert gu._rel(_gate_up(x, r, w, None, True, monkeypatch), gu._want(ref, r, x)) <= TOL[BF16]

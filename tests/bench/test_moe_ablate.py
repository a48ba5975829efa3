"""bench/kernels/moe_ablate.py: its "full" kernel is the decode GEMM (x @ W_e^T of each slot's expert,
against the checkpoint's weights decoded by gptoss.mxfp4.dequantize, float64), whatever the K split;
its "loads" kernel reads every word and scale word of a program's rows once (their XOR); "nodeq"
sums to the same over any K split. In Triton's interpreter on CPU (the portable dequant), float32:
the products are exact, so only the order of the float32 sums differs (relative 1e-5)."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated by triton.jit
pytest.importorskip("triton")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "kernels"))

import moe_ablate  # noqa: E402

from gptoss.kernels.moe_tiles import DecTiles  # noqa: E402
from gptoss.mxfp4 import dequantize  # noqa: E402
from tests.gptoss.kernels.moekit import DEV, make_moe  # noqa: E402

E, H, I = 4, 320, 64  # K 320 = 5 chunks of 64: a last step with masked chunks at BK 128 and 256
IDS = [2, 0, 3]


def _case(dtype=torch.float32):
    ref, w = make_moe(E, H, I, 2, dtype, seed=5, kernels="v3")
    x = torch.randn(1, H, generator=torch.Generator().manual_seed(6)).to(DEV, dtype)
    return ref, w, x, torch.tensor(IDS, dtype=torch.int32, device=DEV)


def _gate_up_ref(ref, x: torch.Tensor, e: int) -> tuple[torch.Tensor, torch.Tensor]:
    ex = ref.experts
    pre = x.double() @ dequantize(ex.gate_up_blocks[e], ex.gate_up_scales[e], torch.float32).double().T
    return pre[0, 0::2], pre[0, 1::2]  # the checkpoint's rows alternate gate, up


@pytest.mark.parametrize(
    ("tiles", "kparts"),
    [
        (DecTiles(1, 32, 128, 2, 2, 2), 1),
        (DecTiles(1, 32, 128, 2, 2, 2), 2),  # 3 steps over 2 programs: 2 + 1
        (DecTiles(1, 32, 128, 2, 2, 2), 3),
        (DecTiles(1, 16, 256, 4, 4, 2), 2),  # BK 256 over 4 warps: 2 steps, the 2nd 1 chunk + 3 masked
    ],
)
def test_full_is_the_gate_up_gemm_over_any_k_split(tiles, kparts):
    ref, w, x, ids = _case()
    out = moe_ablate.ablate(x, ids, w.w13, w.s13, H, tiles, "full", kparts)
    assert out.shape == (kparts, len(IDS), 2 * I)
    pre = out.sum(0).double().view(len(IDS), 2 * I // 16, 2, 8)  # v3 rows 16b + 8h + g: plane h's 8b + g
    for j, e in enumerate(IDS):
        gate, up = _gate_up_ref(ref, x, e)
        for got, want in ((pre[j, :, 0].reshape(I), gate), (pre[j, :, 1].reshape(I), up)):
            assert ((got - want).norm() / want.norm()).item() <= 1e-5


def test_full_reads_the_down_weights_too():
    ref, w, _, ids = _case()
    a = torch.randn(1, I, generator=torch.Generator().manual_seed(7)).to(DEV)
    out = moe_ablate.ablate(a, ids, w.w2, w.s2, I, DecTiles(1, 32, 64, 1, 4, 2), "full", 1)
    ex = ref.experts
    for j, e in enumerate(IDS):
        want = a.double() @ dequantize(ex.down_blocks[e], ex.down_scales[e], torch.float32).double().T
        assert ((out[0, j].double() - want[0]).norm() / want.norm()).item() <= 1e-5


def _xor_all(t: torch.Tensor) -> int:
    return functools.reduce(lambda a, b: a ^ b, t.reshape(-1).tolist(), 0)


@pytest.mark.parametrize(("mode", "kparts"), [("loads", 1), ("loads", 2), ("words", 2), ("loads_sp", 2)])
def test_loads_reads_each_word_of_a_programs_rows_once(mode, kparts):
    _, w, x, ids = _case()
    tiles = DecTiles(1, 32, 128, 2, 2, 2)
    out = moe_ablate.ablate(x, ids, w.w13, w.s13, H, tiles, mode, kparts)
    words = w.w13.view(torch.int32).reshape(E, 2 * I // 16, -1)  # a 16-row block's words contiguous
    scales = w.s13.reshape(-1).view(torch.int32).reshape(E, 2 * I // 16, -1)
    for j, e in enumerate(IDS):
        for b in range(2 * I // 32):
            rows = slice(2 * b, 2 * b + 2)  # BN 32: two 16-row blocks
            want = _xor_all(words[e, rows]) ^ (_xor_all(scales[e, rows]) if mode != "words" else 0)
            assert _xor_all(out[:, j, b]) == want


def test_nodeq_sums_alike_over_a_k_split_and_kparts_is_checked():
    _, w, x, ids = _case(torch.bfloat16)
    tiles = DecTiles(1, 32, 128, 2, 2, 2)
    one = moe_ablate.ablate(x, ids, w.w13, w.s13, H, tiles, "nodeq", 1)
    three = moe_ablate.ablate(x, ids, w.w13, w.s13, H, tiles, "nodeq", 3).sum(0)
    fin = one[0].isfinite() & three.isfinite()  # undecoded bits: some are NaN or inf
    assert fin.sum() > 0
    torch.testing.assert_close(three[fin], one[0][fin], rtol=1e-4, atol=1e-2)
    with pytest.raises(ValueError, match=r"kparts 4 must be within 1\.\.3"):
        moe_ablate.ablate(x, ids, w.w13, w.s13, H, tiles, "full", 4)


def test_dequant_decodes_each_weight_of_a_programs_rows_once():
    """The XOR of the decoded bf16 bits of a program's 32 weight rows (v3 rows 32p.. are act columns
    16p.., the checkpoint's rows 32p.. too: gate and up alternate) over all of K."""
    ref, w, x, ids = _case()
    out = moe_ablate.ablate(x, ids, w.w13, w.s13, H, DecTiles(1, 32, 128, 2, 2, 2), "dequant", 2)
    ex = ref.experts
    for j, e in enumerate(IDS):
        bits = dequantize(ex.gate_up_blocks[e], ex.gate_up_scales[e], torch.bfloat16).view(torch.int16)
        for b in range(2 * I // 32):
            assert _xor_all(out[:, j, b]) == _xor_all(bits[32 * b : 32 * b + 32])

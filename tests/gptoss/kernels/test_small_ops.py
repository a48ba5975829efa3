"""Fused RMSNorm, RoPE + cache write (device sampling: test_sampling_kernel.py), checked against gptoss.model.

Runs in Triton's interpreter on CPU (TRITON_INTERPRET=1, the default here). On a GPU machine run
`TRITON_INTERPRET=0 pytest tests/gptoss/kernels/test_small_ops.py`: the same tests then run compiled
on CUDA, plus the full-shape ones.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from gptoss.config import PRESETS
from gptoss.kernels import rmsnorm
from gptoss.kernels.rmsnorm import fused_add_rms_norm
from gptoss.kernels.rope import build_cos_sin, rope_qkv
from gptoss.kernels.rounding import round_to
from gptoss.model import Rope, apply_rope, rms_norm
from tests.gptoss.kernels.conftest import sass_json
from tests.gptoss.kernels.kernelkit import (  # conftest set TRITON_INTERPRET before triton loaded
    DEV,
    INTERPRETER_WARNINGS,
    gpu,
)

pytestmark = INTERPRETER_WARNINGS


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


@pytest.mark.parametrize("T,H", [(1, 96), (3, 2880)])
def test_rmsnorm_rows_gathers_the_embedding_rows_itself(T: int, H: int) -> None:
    """rows= (the first layer's norm, kernel_model.EMBED_IN_NORM): the same bits as F.embedding and
    then the norm, r holding the gathered rows; a repeated id and the table's last row included."""
    g = torch.Generator().manual_seed(T + H)
    table = (torch.randn(50, H, generator=g) * 3).bfloat16().to(DEV)
    ids = torch.tensor([49, 7, 7][:T], device=DEV)
    w = (1 + 0.1 * torch.randn(H, generator=g)).to(DEV)
    out, r = fused_add_rms_norm(table, None, w, 1e-5, rows=ids)
    want_out, want_r = fused_add_rms_norm(torch.nn.functional.embedding(ids, table), None, w, 1e-5)
    assert torch.equal(r, want_r) and r.data_ptr() != table.data_ptr()
    assert torch.equal(out, want_out)
    with pytest.raises(ValueError, match=r"rows must be int64 \[T\]"):
        fused_add_rms_norm(table, None, w, 1e-5, rows=ids.int())


def test_rmsnorm_loads_its_weight_before_the_pdl_wait() -> None:
    """Compiled for sm_90a on CPU (bench/kernels/pdl_wait_sass.py: bf16, the MoE combine of 4
    rows, a 4096 tile over 16 warps, 8 values a thread): the weight's 8 loads a thread come before
    griddepcontrol.wait (ACQBULK), so after the wait one round trip remains (x's 4 rows and their
    weights, the residual: 4 x 8 + 4 + 8 loads), not a second one for the weight after the sum."""
    got = sass_json("pdl_wait_sass.py")["rmsnorm"]
    assert got["ldg_before_wait"] == 8 and got["ldg_after_wait"] == 4 * 8 + 4 + 8
    assert got["spills"] == 0 and got["wait_then_release"]


def test_rmsnorm_warps_follow_t_unless_batch_invariant(monkeypatch) -> None:
    monkeypatch.setattr(rmsnorm, "LARGE_T", None)
    assert {rmsnorm.num_warps(t, 4096) for t in (1, 300, 8192)} == {16}  # H 2880's block
    monkeypatch.setattr(rmsnorm, "LARGE_T", 256)
    monkeypatch.setattr(rmsnorm, "LARGE_WARPS", 4)
    assert [rmsnorm.num_warps(t, 4096) for t in (1, 255, 256, 8192)] == [16, 16, 4, 4]
    assert [rmsnorm.num_warps(t, 4096, batch_invariant=True) for t in (1, 256, 8192)] == [16, 16, 16]
    assert [rmsnorm.num_warps(t, 256) for t in (1, 256)] == [1, 1]  # never more than the rule gives
    monkeypatch.setattr(rmsnorm, "LARGE_WARPS", 8)
    assert rmsnorm.num_warps(300, 2048) == 8 and rmsnorm.num_warps(300, 1024) == 4


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
    # bit-exact compiled too: the kernel is built without FMA contraction (rope.py's docstring)
    assert torch.equal(q, wq) and torch.equal(k, wk)


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
    assert torch.equal(k, wk)
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
    # batch_invariant: row 0's bits are those of the same row alone, at the launch of T 1.
    alone, _ = fused_add_rms_norm(x[:1], res[:1], w, 1e-5, batch_invariant=True)
    assert torch.equal(fused_add_rms_norm(x, res, w, 1e-5, batch_invariant=True)[0][:1], alone)
    rope = Rope(cfg).to("cuda")
    cos_sin = build_cos_sin(rope, 131072)
    qkv = torch.randn(512, (hq + 2 * hkv) * d, device="cuda").bfloat16()
    positions = torch.randint(0, 131072, (512,), device="cuda")
    q, k, v = rope_qkv(qkv, positions, cos_sin, hq, hkv, d)
    wq, wk, wv = rope_ref(qkv, positions, rope, hq, hkv, d)
    # Exact: with FMA contraction a product and a difference that nearly cancel were 12 bf16 ulps off
    # (H100, 2026-11-23); the kernel now rounds each product as torch does.
    assert torch.equal(q, wq) and torch.equal(k, wk)
    assert torch.equal(v, wv)

"""Batch-invariant mode (gptoss.kernels.batch_invariant): a row's result is bitwise the same alone
and in any batch, for the projections, the MoE, decode attention and the engine's sampled tokens;
and each stays as close to the reference as the default kernels. In Triton's interpreter on CPU at
small shapes, compiled on a GPU. The default kernels change paths with T (GEMV up to 8 tokens then
cuBLAS, MoE decode kernels up to 16 then v2/v3 tiles by rows per expert, attention splits by batch),
so each case crosses those sizes."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from gptoss import kernel_model as km  # noqa: E402
from gptoss.engine import EngineConfig, LLMEngine  # noqa: E402
from gptoss.kernels import batch_invariant as bi  # noqa: E402
from gptoss.kernels.attention import decode_splits  # noqa: E402
from gptoss.kernels.rmsnorm import fused_add_rms_norm  # noqa: E402
from gptoss.sampling import SamplingParams  # noqa: E402
from tests.gptoss.kernels.moekit import (  # noqa: E402, F401 - the autouse fixtures apply here too
    ALPHA,
    DEV,
    LIMIT,
    interpreter_like_the_gpu,
    make_moe,
    poisoned_buffers,
)
from tests.gptoss.kernels.moekit import reference as moe_reference  # noqa: E402
from tests.gptoss.kernels.test_attention_kernel import (  # noqa: E402
    BS,
    TOL,
    assert_rows_close,
    make_step,
    reference,
    run_kernel,
    table_tensor,
)
from tests.gptoss.kernels.test_kernel_engine import make_engine, prompts_of  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")


def _rows_alone(fn, x: torch.Tensor, rows: list[int]) -> list[torch.Tensor]:
    return [fn(x[r : r + 1])[0] for r in rows]


@pytest.mark.parametrize("t", [9, 70])  # past GEMV_MAX_T; past one 64-token block
def test_linear_rows_are_bitwise_the_same_alone_and_in_a_batch(t):
    g = torch.Generator(DEV).manual_seed(0)
    x = torch.randn(t, 96, generator=g, device=DEV).to(torch.bfloat16)  # [T, K]
    w = (torch.randn(40, 96, generator=g, device=DEV) / 10).to(torch.bfloat16)  # [N, K]: a partial N block
    b = torch.randn(40, generator=g, device=DEV).to(torch.bfloat16)
    batch = bi.linear(x, w, b)  # [T, N]
    rows = [0, 5, t - 1]
    for r, alone in zip(rows, _rows_alone(lambda z: bi.linear(z, w, b), x, rows), strict=True):
        assert torch.equal(alone, batch[r]), r
    want = F.linear(x.double(), w.double(), b.double())
    assert (batch.double() - want).abs().max().item() < 0.02 * want.abs().max().item()


def test_moe_rows_are_bitwise_the_same_alone_and_in_a_batch():
    """T 40 runs v2 in the default kernels and T 1 the decode kernels; here both the one v2 tile."""
    ref, w = make_moe(8, 64, 64, 4, torch.bfloat16, seed=3)
    g = torch.Generator(DEV).manual_seed(1)
    x = torch.randn(40, 64, generator=g, device=DEV).to(torch.bfloat16)

    def forward(z: torch.Tensor) -> torch.Tensor:
        return bi.moe_forward(z, ref.router_weight, ref.router_bias, ref.top_k, w, ALPHA, LIMIT)

    batch = forward(x)
    rows = [0, 17, 39]
    for r, alone in zip(rows, _rows_alone(forward, x, rows), strict=True):
        assert torch.equal(alone, batch[r]), r
    want = moe_reference(ref, x)
    rel = ((batch.double() - want.double()).norm() / want.double().norm()).item()
    assert rel < 1e-2, rel


def test_moe_refuses_weights_not_in_the_bits_layout():
    ref, w = make_moe(8, 64, 64, 4, torch.bfloat16, kernels="v1")
    x = torch.zeros(2, 64, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(ValueError, match="needs the bits layout"):
        bi.moe_forward(x, ref.router_weight, ref.router_bias, 4, w, ALPHA, LIMIT)


def test_decode_attention_splits_a_sequence_the_same_way_in_any_batch():
    """A 3000-key context decodes alone and beside 5 others: by default in 64 splits of 64 keys alone
    and 44 of 128 in the batch; batch-invariant, 64 both times and the same bits."""
    ctx = [3000, 30, 300, 129, 900, 64]
    hq, hkv, hint = 8, 2, 16384
    assert (decode_splits(1, hkv, hint), decode_splits(len(ctx), hkv, hint)) == (64, 44)
    st = make_step(ctx, [1] * len(ctx), hq, hkv, torch.float32, seed=11, fill=float("nan"))
    batch = run_kernel(st, "full", max_context_hint=hint, batch_invariant=True)
    assert_rows_close(batch, reference(st, "full"), TOL[torch.float32])
    for s in (0, 4):
        one = dict(st, ctx=[ctx[s]], qlen=[1], tables={"full": [st["tables"]["full"][s]]})
        one |= {n: st[n][s : s + 1] for n in ("q", "k", "v")}
        assert table_tensor(one["tables"]["full"]).shape[1] * BS >= ctx[s] + 1
        alone = run_kernel(one, "full", max_context_hint=hint, batch_invariant=True)
        assert torch.equal(alone[0], batch[s]), s


def test_engine_sampled_tokens_are_the_same_alone_and_in_a_batch(kernel_checkpoint):
    """Seeded temperature-1 sampling turns the last bits of the logits into different tokens; the
    prompts put prefill steps at T 3 .. 65 and decode steps at 1 .. 3 sequences."""
    eng = make_engine(kernel_checkpoint, "triton", dtype="bfloat16", batch_invariant=True)
    assert eng.runner.kernel_runner.model.batch_invariant
    prompts = prompts_of([3, 20, 42], seed=5)
    sp = [SamplingParams(max_new_tokens=5, temperature=1.0, seed=s, ignore_eos=True) for s in (1, 2, 3)]
    together = eng.generate(prompts, sp)
    alone = [eng.generate([p], [s])[0] for p, s in zip(prompts, sp, strict=True)]
    assert together == alone
    assert [len(t) for t in together] == [5, 5, 5]


def test_every_norm_of_the_mode_asks_for_the_launch_of_t_1(kernel_checkpoint, monkeypatch):
    """rmsnorm takes fewer warps a row from LARGE_T rows on (another order of its sum): the mode's
    norms (ln1, ln2, the final one) all pass batch_invariant, the default engine's none."""
    seen: list[tuple[bool, int]] = []

    def spy(x, *args, **kw):
        seen.append((kw.get("batch_invariant", False), x.shape[0]))
        return fused_add_rms_norm(x, *args, **kw)

    monkeypatch.setattr(km, "fused_add_rms_norm", spy)
    prompts = prompts_of([9, 3], seed=2)
    sp = [SamplingParams(max_new_tokens=2, temperature=0.0, ignore_eos=True)] * 2
    for invariant in (True, False):
        seen.clear()
        make_engine(kernel_checkpoint, "triton", batch_invariant=invariant).generate(prompts, sp)
        layers = json.loads((kernel_checkpoint / "config.json").read_text())["num_hidden_layers"]
        assert len(seen) >= layers + 1 and {flag for flag, _ in seen} == {invariant}


def test_engine_config_refuses_what_the_mode_does_not_cover(tiny_checkpoint):
    with pytest.raises(ValueError, match="needs the triton kernels"):
        EngineConfig(tiny_checkpoint, kernels="torch", batch_invariant=True)
    with pytest.raises(ValueError, match="does not cover LoRA"):
        EngineConfig(tiny_checkpoint, batch_invariant=True, lora=("/nowhere",))
    if DEV == "cpu":  # no --kernels given: torch on CPU, which the mode does not cover
        with pytest.raises(ValueError, match="needs the triton kernels; cpu runs torch"):
            LLMEngine(EngineConfig(tiny_checkpoint, device="cpu", batch_invariant=True))

"""--kv-cache-dtype fp8: the kernels store exactly torch's e4m3 bytes (gptoss.kv_dtype.quantize),
attention over an e4m3 cache is attention over the rounded values bit for bit (this step's own keys
rounded too), and the engine on the Triton kernels gives the torch reference's greedy tokens with it.
Without CUDA the kernels run in Triton's interpreter."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from gptoss.config import PRESETS
from gptoss.engine_config import EngineConfig
from gptoss.kernels.attention import paged_attention
from gptoss.kernels.fp8 import to_cache
from gptoss.kernels.kv_write import write_kv
from gptoss.kernels.rope import build_cos_sin, rope_qkv
from gptoss.kv_dtype import quantize
from gptoss.model import Rope
from gptoss.sampling import SamplingParams
from tests.gptoss.kernels.kernelkit import INTERPRETER_WARNINGS  # conftest set TRITON_INTERPRET first
from tests.gptoss.kernels.test_attention_kernel import BS, DEV, make_step, run_kernel
from tests.gptoss.kernels.test_kernel_engine import make_engine, prompts_of

pytestmark = INTERPRETER_WARNINGS
F8 = torch.float8_e4m3fn
D = 64


@triton.jit
def _store_kernel(src, dst, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(dst + i, to_cache(tl.load(src + i), True, tl.float32))


def rounding_cases() -> torch.Tensor:
    """Every finite e4m3 value, the midpoints between neighbours (ties both ways), random values over
    eight decades, signed zeros, the saturation edge and far past it."""
    codes = torch.arange(256, dtype=torch.uint8)
    exact = codes[(codes & 0x7F) != 0x7F].view(F8).float()
    ordered = exact.unique().sort().values
    g = torch.Generator().manual_seed(0)
    rand = [torch.randn(2048, generator=g) * s for s in (1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0, 100.0, 1e3)]
    edges = torch.tensor([0.0, -0.0, 448.0, -448.0, 449.0, 464.0, 1e9, -1e9, 2**-10, 2**-6 - 2**-12])
    return torch.cat([exact, (ordered[1:] + ordered[:-1]) / 2, *rand, edges])


def test_kernel_rounding_gives_torchs_bytes():
    x = rounding_cases()
    n = triton.next_power_of_2(x.numel())
    src = torch.zeros(n, device=DEV)
    src[: x.numel()] = x.to(DEV)
    dst = torch.empty(n, dtype=F8, device=DEV)
    _store_kernel[(1,)](src, dst, N=n)
    got, want = dst[: x.numel()].cpu().view(torch.uint8), quantize(x).view(torch.uint8)
    bad = (got != want).nonzero().flatten()
    assert bad.numel() == 0, f"{bad.numel()} values differ, first {x[bad[:4]].tolist()}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_write_kv_stores_the_rounded_bytes(dtype):
    g = torch.Generator().manual_seed(1)
    k, v = ((torch.randn(6, 2, D, generator=g) * 200).to(dtype).to(DEV) for _ in range(2))  # some past 448
    slots = torch.tensor([3, 17, -1, 0, 40, 33], device=DEV)
    kc, vc = (torch.zeros(3, BS, 2, D, dtype=F8, device=DEV) for _ in range(2))
    write_kv(k, v, kc, vc, slots)
    for new, cache in ((k, kc), (v, vc)):
        want = torch.zeros(3 * BS, 2, D, dtype=torch.uint8)
        for t, s in enumerate(slots.tolist()):
            if s >= 0:
                want[s] = quantize(new[t].cpu()).view(torch.uint8)
        assert torch.equal(cache.cpu().view(torch.uint8).view(-1, 2, D), want)
    assert (k.float().abs() > 448).any()  # saturation was exercised


def test_rope_qkv_stores_the_rounded_roped_keys():
    hq, hkv, t = 4, 2, 5
    g = torch.Generator().manual_seed(2)
    qkv = (torch.randn(t, (hq + 2 * hkv) * D, generator=g) * 3).to(torch.bfloat16).to(DEV)
    pos = torch.tensor([0, 5, 16, 31, 100], device=DEV)
    cs = build_cos_sin(Rope(PRESETS["20b"]).to(DEV), 128)
    slots = torch.tensor([1, 20, -1, 7, 44], device=DEV)
    q0, k0, v0 = rope_qkv(qkv, pos, cs, hq, hkv, D)
    kc, vc = (torch.zeros(3, BS, hkv, D, dtype=F8, device=DEV) for _ in range(2))
    q, k, v = rope_qkv(qkv, pos, cs, hq, hkv, D, kc, vc, slots)
    assert torch.equal(q, q0) and torch.equal(k, k0) and torch.equal(v, v0)  # outputs as without a cache
    for new, cache in ((k0, kc), (v0, vc)):
        flat = cache.cpu().view(torch.uint8).view(-1, hkv, D)
        for i, s in enumerate(slots.tolist()):
            if s >= 0:
                assert torch.equal(flat[s], quantize(new[i].cpu()).view(torch.uint8))
        assert not flat[[s for s in range(3 * BS) if s not in slots.tolist()]].any()  # nothing else


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("pool", ["full", "ring"])
@pytest.mark.parametrize(
    ("ctx", "qlen"),
    [([0, 17, 129, 300], [1, 1, 1, 1]), ([0, 40, 129], [20, 3, 9])],
    ids=["decode", "prefill"],
)
def test_attention_over_an_fp8_cache_is_attention_over_the_rounded_values(ctx, qlen, pool, dtype):
    st = make_step(ctx, qlen, 16, 2, dtype, seed=sum(ctx), fill=0.0)
    for x in ("k", "v"):
        st[x] = st[x] * 60  # past 448 somewhere: saturation in the step's own keys too
    rounded = dict(st)
    rounded["caches"] = {p: quantize(c).to(dtype) for p, c in st["caches"].items()}
    rounded["k"], rounded["v"] = (quantize(st[x]).to(dtype) for x in ("k", "v"))
    want = run_kernel(rounded, pool)
    st["caches"] = {p: quantize(c) for p, c in st["caches"].items()}
    got = run_kernel(st, pool)
    assert torch.equal(got, want)
    assert not torch.equal(want, run_kernel({**rounded, "k": st["k"], "v": st["v"]}, pool))  # k, v rounded


def test_attention_refuses_other_cache_dtypes_and_rope_over_fp8():
    st = make_step([3], [1], 16, 2, torch.float32, seed=0, fill=0.0)
    st["caches"] = {p: c.half() for p, c in st["caches"].items()}
    with pytest.raises(
        ValueError, match="the caches must be in q's dtype or float8_e4m3fn, got torch.float16"
    ):
        run_kernel(st, "full")
    kc, vc = (torch.zeros(2, BS, 2, D, dtype=F8, device=DEV) for _ in range(2))
    q, k = torch.zeros(1, 16, D, device=DEV), torch.zeros(1, 2, D, device=DEV)
    one = torch.zeros(1, dtype=torch.int64, device=DEV)
    rope = (one, torch.zeros(8, D, device=DEV), one)
    table, qs = (
        torch.zeros(1, 1, dtype=torch.int32, device=DEV),
        torch.tensor([0, 1], dtype=torch.int32, device=DEV),
    )
    lens, sinks = torch.zeros(1, dtype=torch.int32, device=DEV), torch.zeros(16, device=DEV)
    with pytest.raises(ValueError, match="does not cover a float8 KV cache"):
        paged_attention(q, k, k, kc, vc, table, qs, lens, sinks, 0.1, None, None, 1, rope=rope)


def test_engine_config_takes_fp8_and_refuses_others():
    assert EngineConfig(kv_cache_dtype="fp8").kv_cache_dtype == "fp8"
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, fp8, got 'int8'"):
        EngineConfig(kv_cache_dtype="int8")


def test_engine_greedy_tokens_equal_the_torch_reference_with_an_fp8_cache(kernel_checkpoint):
    """Chunked prefill (16-token steps over a 40-token prompt), the 128 window's ring and decode."""
    prompts = prompts_of([40, 3, 140], seed=21)
    params = [SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True) for n in (6, 9, 4)]
    kw = {"kv_cache_dtype": "fp8", "cuda_graphs": False, "max_num_batched_tokens": 16}
    ref = make_engine(kernel_checkpoint, "torch", **kw)
    tri = make_engine(kernel_checkpoint, "triton", **kw)
    for eng in (ref, tri):
        assert all(c.dtype == F8 for c in eng.runner.attn.cache.values())
        assert eng.info()["kv_cache_dtype"] == "fp8"
    assert tri.generate(prompts, params) == ref.generate(prompts, params)


def test_the_same_memory_holds_twice_the_tokens(tiny_checkpoint, monkeypatch):
    """Sized from memory (no --kv-cache-tokens): an fp8 cache holds twice bf16's tokens in as many
    bytes. The torch engine (no kernels needed for the sizing)."""
    from gptoss.engine import LLMEngine
    from gptoss.model_runner import ModelRunner

    monkeypatch.setattr(ModelRunner, "_kv_budget", lambda self, config: 3 << 20)
    tokens, nbytes = {}, {}
    for kv in ("auto", "fp8"):
        eng = LLMEngine(EngineConfig(tiny_checkpoint, kernels="torch", max_num_seqs=512, kv_cache_dtype=kv))
        tokens[kv] = eng.info()["kv_cache_tokens"]
        nbytes[kv] = sum(
            c.numel() * c.element_size() for c in {id(c): c for c in eng.runner.attn.cache.values()}.values()
        )
    assert tokens["fp8"] == 2 * tokens["auto"]
    assert nbytes["fp8"] == nbytes["auto"] <= 3 << 20

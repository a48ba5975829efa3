"""paged_attention(rope=...): decode attention that ropes q and this step's key and writes the KV cache
itself gives the bits of rope_qkv(..., caches) followed by paged_attention, both in its output and in
the caches; and the engine's GPTOSS_ROPE_IN_ATTN decode path gives the same greedy tokens.

Without CUDA the kernels run in Triton's interpreter (small shapes); on a GPU machine
`pytest tests/gptoss/kernels/test_attention_rope.py` runs them compiled.
"""

from __future__ import annotations

import os

import pytest
import torch

from gptoss.config import PRESETS
from gptoss.kernels.attention import paged_attention
from gptoss.kernels.rope import build_cos_sin, rope_qkv
from gptoss.model import Rope
from gptoss.sampling import SamplingParams
from tests.gptoss.kernels.conftest import record_launches, sass_json
from tests.gptoss.kernels.kernelkit import INTERPRETER_WARNINGS  # conftest set TRITON_INTERPRET first
from tests.gptoss.kernels.test_attention_kernel import (
    BS,
    DEV,
    RING,
    SCALE,
    WINDOW,
    make_step,
    table_tensor,
)
from tests.gptoss.kernels.test_kernel_engine import make_engine, prompts_of

pytestmark = INTERPRETER_WARNINGS

D = 64  # the YaRN table's head_dim (the 20b preset's)
CTX = [0, 1, 15, 16, 17, 127, 128, 129, 300]  # block edges, the 128 window, the ring's wrap
SKIP = 7  # this sequence's slot is -1: nothing may be stored for it, and nothing read from its slot


def bits(x: torch.Tensor) -> torch.Tensor:
    """The raw bits, so NaN fill compares equal to itself and -0.0 differs from 0.0."""
    return x.view({torch.float32: torch.int32, torch.bfloat16: torch.int16}[x.dtype])


def setup(ctx: list[int], pool: str, hq: int, hkv: int, dtype: torch.dtype, seed: int) -> dict:
    """make_step's caches and tables (NaN where nothing was written), the un-roped QKV output of one
    decode token per sequence at position ctx, the 20b YaRN table and each new token's cache slot."""
    st = make_step(ctx, [1] * len(ctx), hq, hkv, dtype, seed=seed, fill=float("nan"))
    g = torch.Generator().manual_seed(seed)
    st["qkv"] = (torch.randn(len(ctx), (hq + 2 * hkv) * D, generator=g) * 2).to(dtype).to(DEV)
    st["pos"] = torch.tensor(ctx, device=DEV)
    st["cos_sin"] = build_cos_sin(Rope(PRESETS["20b"]).to(DEV), 512)
    tables = st["tables"][pool]
    slots = [
        tables[s][c // BS % RING if pool == "ring" else c // BS] * BS + c % BS for s, c in enumerate(ctx)
    ]
    if SKIP < len(ctx):
        slots[SKIP] = -1
    st["slots"] = torch.tensor(slots, device=DEV)
    return st


def attend(st: dict, pool: str, fused: bool, **kw) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, k_cache, v_cache) on a fresh copy of the pool's caches: rope_qkv writes the caches, then
    paged_attention; or (fused) paged_attention(rope=...) on views of the QKV output."""
    kc, vc = (c.clone() for c in st["caches"][pool])
    hq, hkv = st["q"].shape[1], st["k"].shape[1]
    t = st["qkv"].shape[0]
    rope = (st["pos"], st["cos_sin"], st["slots"])
    if fused:
        q, k, v = st["qkv"].view(t, -1, D).split((hq, hkv, hkv), dim=1)
        assert not q.is_contiguous()  # strided views of the QKV output, as the engine passes them
    else:
        q, k, v = rope_qkv(st["qkv"], *rope[:2], hq, hkv, D, kc, vc, st["slots"])
    out = paged_attention(
        q,
        k,
        v,
        kc,
        vc,
        table_tensor(st["tables"][pool]),
        torch.arange(t + 1, dtype=torch.int32, device=DEV),
        torch.tensor(st["ctx"], dtype=torch.int32, device=DEV),
        st["sinks"],
        SCALE,
        WINDOW if pool == "ring" else None,
        RING if pool == "ring" else None,
        1,
        rope=rope if fused else None,
        **kw,
    )
    return out, kc, vc


def assert_same_bits(st: dict, pool: str, **kw) -> None:
    want = attend(st, pool, fused=False, **kw)
    got = attend(st, pool, fused=True, **kw)
    for name, a, b in zip(("out", "k_cache", "v_cache"), got, want, strict=True):
        assert torch.equal(bits(a), bits(b)), f"{name} differs"
    assert not want[0].isnan().any()  # no NaN fill was read
    assert not torch.equal(bits(want[1]), bits(st["caches"][pool][0]))  # the step's keys were stored


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("pool", ["full", "ring"])
@pytest.mark.parametrize("hint", [None, 4096], ids=["table", "splits16"])
def test_fused_rope_gives_the_unfused_bits(hint, pool, dtype, monkeypatch):
    """hint None: the table's blocks bound the keys (full: 2 splits); 4096: full 16 splits, the new key
    in the last non-empty one, many empty ones after it; the ring's 128 keys in 4 splits of 32."""
    from gptoss.kernels import attention

    if hint and pool == "ring":
        monkeypatch.setattr(attention, "MIN_SPLIT_KEYS", 32)
    st = setup(CTX, pool, 16, 2, dtype, seed=len(CTX) + (pool == "ring"))
    keys = WINDOW if pool == "ring" else hint or table_tensor(st["tables"]["full"]).shape[1] * BS
    want = {("full", None): 2, ("full", 4096): 16, ("ring", None): 1, ("ring", 4096): 4}[pool, hint]
    assert attention.decode_splits(len(CTX), 2, keys) == want
    assert_same_bits(st, pool, max_context_hint=hint)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_fused_rope_one_pass_and_merge_in_kernel(dtype):
    """hint 200: no split (the key phase ends the program); merge_in_kernel: the ticket merge."""
    st = setup([300, 0, 129, 17], "full", 16, 2, dtype, seed=3)
    assert_same_bits(st, "full", max_context_hint=200)
    assert_same_bits(st, "full", max_context_hint=4096, merge_in_kernel=True)


@pytest.mark.parametrize("pool", ["full", "ring"])
def test_fused_rope_with_the_small_launches_wide_tile(pool, monkeypatch):
    """SMALL_DECODE_CFG (128, 4, 2) with 128-key splits: the new key's tile is 128 rows wide (row 0
    the key), the ring's window one split; the fused path keeps the unfused bits."""
    from gptoss.kernels import attention

    monkeypatch.setattr(attention, "SMALL_DECODE_CFG", (128, 4, 2))
    monkeypatch.setattr(attention, "SMALL_SPLIT_KEYS", 128)
    ctx = [0, 1, 16, 17, 127, 128, 129, 300]  # SMALL_DECODE sequences: a small launch
    assert len(ctx) == attention.SMALL_DECODE
    st = setup(ctx, pool, 16, 2, torch.bfloat16, seed=21)
    assert_same_bits(st, pool, max_context_hint=4096)


@pytest.mark.parametrize("pool", ["full", "ring"])
def test_fused_rope_group_of_four_heads(pool):
    """Hq 8 over Hkv 2: G = 4, so a decode program's rows hold 4 token slots, 3 of them masked."""
    st = setup([129, 40, 0], pool, 8, 2, torch.bfloat16, seed=5)
    assert_same_bits(st, pool)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("pool", ["full", "ring"])
@pytest.mark.parametrize("fused", [True, False], ids=["rope-inside", "rope-qkv"])
@pytest.mark.parametrize("ctx", [CTX[:8], CTX], ids=["small-launch", "large-launch"])
def test_new_keys_tile_of_16_gives_the_bits_of_a_whole_tile(ctx, fused, pool, dtype, monkeypatch):
    """GPTOSS_ATTN_NEW_KEYS: a decode's one new key a sequence runs its softmax step on a 16-key
    tile instead of the launch's BLOCK_N (256 for a small launch, 32 for a large one): out and the
    caches keep their bits, with RoPE inside attention and without, over splits and one pass."""
    from gptoss.kernels import attention

    st = setup(ctx, pool, 16, 2, dtype, seed=41 + len(ctx))
    widths = record_launches(monkeypatch, attention, "_attn_kernel", "NEW_N")
    monkeypatch.setattr(attention, "NEW_KEYS_N", 0)
    want = attend(st, pool, fused, max_context_hint=4096)
    monkeypatch.setattr(attention, "NEW_KEYS_N", 16)
    got = attend(st, pool, fused, max_context_hint=4096)
    assert widths == [0, 16]
    for name, a, b in zip(("out", "k_cache", "v_cache"), got, want, strict=True):
        assert torch.equal(bits(a), bits(b)), f"{name} differs"
    assert not got[0].isnan().any()


def test_rope_refuses_prefill_launches_and_bad_operands():
    st = setup([5, 7], "full", 16, 2, torch.float32, seed=1)
    kc, vc = st["caches"]["full"]
    q, k, v = st["qkv"].view(2, -1, D).split((16, 2, 2), dim=1)
    args = (
        table_tensor(st["tables"]["full"]),
        torch.tensor([0, 1, 2], dtype=torch.int32, device=DEV),
        torch.tensor([5, 7], dtype=torch.int32, device=DEV),
        st["sinks"],
        SCALE,
        None,
        None,
    )
    rope = (st["pos"], st["cos_sin"], st["slots"])
    with pytest.raises(ValueError, match="decode launches only"):
        paged_attention(q, k, v, kc, vc, *args, 2, rope=rope)
    with pytest.raises(ValueError, match="positions and slot_mapping must be"):
        paged_attention(q, k, v, kc, vc, *args, 1, rope=(st["pos"][:1], *rope[1:]))
    with pytest.raises(ValueError, match="cos_sin must be a contiguous float32"):
        paged_attention(q, k, v, kc, vc, *args, 1, rope=(st["pos"], st["cos_sin"].double(), st["slots"]))


def test_engine_rope_in_attention_gives_the_same_tokens(kernel_checkpoint, monkeypatch):
    """GPTOSS_ROPE_IN_ATTN: decode-only steps skip rope_qkv and hand attention the un-roped views;
    the prefill step keeps rope_qkv. Greedy tokens equal the switch off's."""
    from gptoss import kernel_model

    assert kernel_model.ROPE_IN_ATTN == (os.environ.get("GPTOSS_ROPE_IN_ATTN", "1") != "0")  # on by default
    prompts = prompts_of([3, 14], seed=12)  # 14: decode positions cross a block edge (16)
    params = [SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True) for n in (5, 4)]
    monkeypatch.setattr(kernel_model, "ROPE_IN_ATTN", False)
    want = make_engine(kernel_checkpoint, "triton", cuda_graphs=False).generate(prompts, params)

    monkeypatch.setattr(kernel_model, "ROPE_IN_ATTN", True)
    launches = {"rope_qkv": 0, "fused": 0}
    rope_qkv_fn, attention_fn = kernel_model.rope_qkv, kernel_model.paged_attention

    def counted_rope(*a, **kw):
        launches["rope_qkv"] += 1
        return rope_qkv_fn(*a, **kw)

    def counted_attention(*a, **kw):
        launches["fused"] += kw.get("rope") is not None
        return attention_fn(*a, **kw)

    monkeypatch.setattr(kernel_model, "rope_qkv", counted_rope)
    monkeypatch.setattr(kernel_model, "paged_attention", counted_attention)
    eng = make_engine(kernel_checkpoint, "triton", cuda_graphs=False)
    launches.update(rope_qkv=0, fused=0)  # the generate's, not the start-up warm-up's steps (on a GPU)
    assert eng.generate(prompts, params) == want
    layers = len(eng.runner.kernel_runner.model.layers)
    # One prefill step (rope_qkv), then 4 decode-only steps (the longest request's 4 more tokens).
    assert launches == {"rope_qkv": layers, "fused": 4 * layers}


def test_what_the_host_wrote_loads_before_the_pdl_wait():
    """Compiled for sm_90a on CPU (bench/kernels/pdl_wait_sass.py: a bf16 decode launch at the
    engine's DECODE_CFG): the step's three metadata words (query start, length, context) load
    before griddepcontrol.wait (ACQBULK); with RoPE inside, so do the positions, their RoPE table
    rows and the new key's cache slot, so after the wait no round trip precedes q's, and the
    release (PREEXIT) comes after the wait; no spills. With the first tile preloaded, its table
    entries, K and V come before the wait as well."""
    got = sass_json("pdl_wait_sass.py")
    plain, rope, pre = got["attention"], got["attention rope"], got["attention rope preload"]
    assert plain["ldg_before_wait"] == 3
    assert rope["ldg_before_wait"] >= plain["ldg_before_wait"] + 4  # positions, cos and sin, the slot
    # GPTOSS_ATTN_PRELOAD: the first tile's table entries, K and V too (BLOCK_N x D of each over the
    # program's threads, at least one 16-byte load a thread each)
    assert pre["ldg_before_wait"] >= rope["ldg_before_wait"] + 3
    for v in (plain, rope, pre):
        assert v["ldg_after_wait"] > 0 and v["spills"] == 0 and v["wait_then_release"]

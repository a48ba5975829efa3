"""Triton paged attention against a torch reference and the PagedAttention oracle, and write_kv.

Without CUDA the kernels run in Triton's interpreter on CPU (small shapes); with CUDA the same
tests run compiled, plus full gpt-oss shapes. Error of a [D] output row = ||got - want|| / ||want||
(per token and head, so a head the +30 sink shrinks to ~1e-13 is judged on its own scale).
Tolerances: float32 1e-5 (seen ~3e-6); bfloat16 2e-2 against the float64 reference (seen ~7e-3:
bf16 probabilities in the P @ V dot and the bf16 output) and 3e-2 against the bf16 oracle, which
also rounds its scores to bf16 (seen ~1.4e-2; the oracle itself is ~1.1e-2 from the reference).
"""

from __future__ import annotations

import math
import os
import random

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated by triton.jit
pytest.importorskip("triton")
# The interpreter turns loop bounds into ints through a deprecated numpy conversion.
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")

from gptoss.kernels.attention import paged_attention  # noqa: E402
from gptoss.kernels.kv_write import write_kv  # noqa: E402
from gptoss.paged_attention import PagedAttention, StepContext  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BS, D, WINDOW = 16, 64, 128
RING = math.ceil(WINDOW / BS)  # 8 blocks of 16: the ring keeps the last 128 positions
SCALE = 0.125
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
TOL_ORACLE = {torch.float32: 1e-5, torch.bfloat16: 3e-2}


def make_step(
    ctx_lens: list[int], q_lens: list[int], hq: int, hkv: int, dtype: torch.dtype, seed: int, fill: float
) -> dict:
    """Random caches of both pools holding each sequence's context, block tables with shuffled
    block ids, and this step's q / new K / new V. Slots nobody wrote hold `fill`."""
    g = torch.Generator(DEV).manual_seed(seed)
    rng = random.Random(seed)
    total = [c + n for c, n in zip(ctx_lens, q_lens, strict=False)]
    full_need = [math.ceil(n / BS) for n in total]
    ring_need = [min(f, RING) for f in full_need]
    full_ids = list(range(sum(full_need) + 3))
    ring_ids = list(range(sum(ring_need) + 3))
    rng.shuffle(full_ids)
    rng.shuffle(ring_ids)
    full_tables = [[full_ids.pop() for _ in range(n)] for n in full_need]
    ring_tables = [[ring_ids.pop() for _ in range(n)] for n in ring_need]
    caches = {}
    for pool, nblocks in (("full", sum(full_need) + 3), ("ring", sum(ring_need) + 3)):
        caches[pool] = torch.full((2, nblocks, BS, hkv, D), fill, dtype=dtype, device=DEV)
    for s, c in enumerate(ctx_lens):
        kv = torch.randn(2, c, hkv, D, generator=g, device=DEV).to(dtype)
        p = torch.arange(c, device=DEV)
        caches["full"][:, torch.tensor(full_tables[s], device=DEV)[p // BS], p % BS] = kv
        p = p[max(0, c - RING * BS) :]  # only the ring's last R*bs positions survive
        caches["ring"][:, torch.tensor(ring_tables[s], device=DEV)[p // BS % RING], p % BS] = kv[:, p]
    t = sum(q_lens)
    sinks = torch.randn(hq, generator=g, device=DEV)
    sinks[0], sinks[1] = float("-inf"), 30.0  # a head without a sink, a head the sink dominates
    new = {
        x: torch.randn(t, h, D, generator=g, device=DEV).to(dtype)
        for x, h in (("q", hq), ("k", hkv), ("v", hkv))
    }
    return dict(
        ctx=ctx_lens,
        qlen=q_lens,
        caches=caches,
        tables={"full": full_tables, "ring": ring_tables},
        sinks=sinks,
        **new,
    )


def table_tensor(tables: list[list[int]]) -> torch.Tensor:
    width = max(map(len, tables))
    return torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device=DEV)


def pool_window(pool: str, window: int | None | str) -> int | None:
    """ "pool": the pool's own (a ring is sliding, a block table full); else as given."""
    return (WINDOW if pool == "ring" else None) if window == "pool" else window


def run_kernel(st: dict, pool: str, window: int | None | str = "pool", **kw) -> torch.Tensor:
    kc, vc = st["caches"][pool]
    qs = torch.tensor([0] + st["qlen"], device=DEV).cumsum(0).to(torch.int32)
    out = torch.full_like(st["q"], float("nan"))  # every real row must be written
    got = paged_attention(
        st["q"],
        st["k"],
        st["v"],
        kc,
        vc,
        table_tensor(st["tables"][pool]),
        qs,
        torch.tensor(st["ctx"], dtype=torch.int32, device=DEV),
        st["sinks"],
        SCALE,
        pool_window(pool, window),
        RING if pool == "ring" else None,
        max(st["qlen"]),
        out=out,
        **kw,
    )
    assert got is out
    return out


def reference(st: dict, pool: str, window: int | None | str = "pool") -> torch.Tensor:
    """float64: each sequence's visible context gathered by position from the cache, then its new
    keys; masked softmax with the sink logit in the denominator."""
    kc, vc = st["caches"][pool]
    window = pool_window(pool, window)
    outs, row = [], 0
    hq, hkv = st["q"].shape[1], st["k"].shape[1]
    sink = st["sinks"].double().view(1, hkv, -1, 1)
    for s, (c, n) in enumerate(zip(st["ctx"], st["qlen"], strict=False)):
        p = torch.arange(max(0, c - WINDOW + 1) if window else 0, c, device=DEV)  # older ring slots are gone
        blk = torch.tensor(st["tables"][pool][s], device=DEV)[p // BS % RING if pool == "ring" else p // BS]
        keys = torch.cat([kc[blk, p % BS], st["k"][row : row + n]]).double()  # [K, Hkv, D]
        vals = torch.cat([vc[blk, p % BS], st["v"][row : row + n]]).double()
        kpos = torch.cat([p, torch.arange(c, c + n, device=DEV)])
        for a in range(0, n, 1024):  # query slices bound the [n, Hkv, G, K] scores
            qpos = torch.arange(c + a, c + min(n, a + 1024), device=DEV)
            q = st["q"][row + a : row + a + len(qpos)].double().view(len(qpos), hkv, hq // hkv, D)
            scores = torch.einsum("tkgd,skd->tkgs", q, keys) * SCALE
            dist = qpos[:, None] - kpos[None, :]  # [n, K]
            seen = (dist >= 0) & ((dist < window) if window else True)
            scores = scores.masked_fill(~seen[:, None, None, :], float("-inf"))
            m = torch.maximum(scores.amax(-1, keepdim=True), sink)
            e = torch.exp(scores - m)
            prob = e / (e.sum(-1, keepdim=True) + torch.exp(sink - m))
            outs.append(torch.einsum("tkgs,skd->tkgd", prob, vals).reshape(len(qpos), hq, D))
        row += n
    return torch.cat(outs)


def oracle(st: dict, pool: str) -> torch.Tensor:
    """gptoss.paged_attention.PagedAttention over the same caches and tables (one ring layer,
    one full layer); it writes the step's K/V itself, then attends."""
    hkv, dtype, cpu = st["k"].shape[1], st["k"].dtype, torch.device("cpu")
    nfull, nring = st["caches"]["full"].shape[1], st["caches"]["ring"].shape[1]
    attn = PagedAttention([WINDOW, None], nfull, nring, BS, hkv, D, dtype, cpu)
    for kind in ("full", "ring"):  # zeros, not NaN, where nothing was written: the oracle pads with real rows
        attn.cache[kind][0].copy_(st["caches"][kind].nan_to_num(0.0).view(2, -1, D))
    attn.ctx = StepContext.build(
        st["ctx"], st["qlen"], st["tables"]["full"], st["tables"]["ring"], BS, WINDOW, hkv, cpu
    )
    layer, window = (0, WINDOW) if pool == "ring" else (1, None)
    return attn(layer, *(st[x].cpu() for x in ("q", "k", "v", "sinks")), window, SCALE).to(DEV)


def assert_rows_close(got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    assert not got.isnan().any(), "rows left unwritten or NaN"
    want = want.double()
    err = (got.double() - want).norm(dim=-1) / want.norm(dim=-1).clamp_min(1e-300)  # [T, Hq]
    assert err.max() < tol, f"max row error {err.max():.3g} at {divmod(int(err.argmax()), err.shape[1])}"


DECODES = [[0, 1, 15, 16, 17], [127, 128, 129, 300], [300]]
# (context, q_len) per sequence; single-token sequences first, as the engine orders a step.
PREFILLS = [
    [(0, 70)],
    [(1, 15), (127, 16), (129, 40), (17, 1)][::-1],
    [(300, 1), (16, 17), (128, 70)],
    [(15, 2), (300, 33)],
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("pool", ["full", "ring"])
@pytest.mark.parametrize("ctx", DECODES, ids=str)
def test_decode_matches_reference_and_oracle(ctx, pool, dtype):
    st = make_step(ctx, [1] * len(ctx), 16, 2, dtype, seed=len(ctx), fill=float("nan"))
    got = run_kernel(st, pool)
    assert_rows_close(got, reference(st, pool), TOL[dtype])
    st["caches"] = {k: c.nan_to_num(0.0) for k, c in st["caches"].items()}
    assert_rows_close(run_kernel(st, pool), oracle(st, pool), TOL_ORACLE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("pool", ["full", "ring"])
@pytest.mark.parametrize("seqs", PREFILLS, ids=str)
def test_prefill_matches_reference_and_oracle(seqs, pool, dtype):
    ctx, qlen = [c for c, _ in seqs], [n for _, n in seqs]
    st = make_step(ctx, qlen, 16, 2, dtype, seed=sum(qlen), fill=float("nan"))
    assert_rows_close(run_kernel(st, pool), reference(st, pool), TOL[dtype])
    st["caches"] = {k: c.nan_to_num(0.0) for k, c in st["caches"].items()}
    assert_rows_close(run_kernel(st, pool), oracle(st, pool), TOL_ORACLE[dtype])


@pytest.mark.parametrize("pool", ["full", "ring"])
def test_group_of_four_heads(pool):
    """Hq 8 over Hkv 2: G = 4, so prefill tiles hold 32 tokens and decode rows 4 tokens' worth."""
    for ctx, qlen in (([129, 40], [1, 1]), ([0, 140], [50, 9])):
        st = make_step(ctx, qlen, 8, 2, torch.float32, seed=3, fill=float("nan"))
        assert_rows_close(run_kernel(st, pool), reference(st, pool), TOL[torch.float32])


def test_mixed_step_as_two_launches():
    """A step's decodes (max_query_len 1: split-K path) and its prefill chunks as two launches over
    the same q/out: row slices of the table, context_lens and query_start, no rebasing."""
    ctx, qlen = [300, 17, 129, 40], [1, 1, 33, 2]
    st = make_step(ctx, qlen, 16, 2, torch.float32, seed=5, fill=float("nan"))
    kc, vc = st["caches"]["full"]
    table = table_tensor(st["tables"]["full"])
    qs = torch.tensor([0] + qlen, device=DEV).cumsum(0).to(torch.int32)
    lens = torch.tensor(ctx, dtype=torch.int32, device=DEV)
    out = torch.full_like(st["q"], float("nan"))
    args = (st["sinks"], SCALE, None, None)
    paged_attention(
        st["q"],
        st["k"],
        st["v"],
        kc,
        vc,
        table[:2],
        qs[:3],
        lens[:2],
        *args,
        1,
        out=out,
        max_context_hint=4096,
    )
    paged_attention(st["q"], st["k"], st["v"], kc, vc, table[2:], qs[2:], lens[2:], *args, 33, out=out)
    assert_rows_close(out, reference(st, "full"), TOL[torch.float32])


def test_window_over_a_block_table():
    """A sliding layer may also read a full block table (no ring): same window semantics."""
    st = make_step([1, 300, 140], [1, 20, 9], 16, 2, torch.float32, seed=2, fill=float("nan"))
    assert_rows_close(
        run_kernel(st, "full", window=WINDOW), reference(st, "full", window=WINDOW), TOL[torch.float32]
    )


def test_sliding_window_skips_keys_outside_it():
    """Poison every ring slot the window hides with inf: one load of them would give NaN."""
    st = make_step([300], [5], 16, 2, torch.float32, seed=1, fill=float("nan"))
    kc, vc = st["caches"]["ring"]
    table = torch.tensor(st["tables"]["ring"][0], device=DEV)
    stale = torch.arange(300 - RING * BS, 300 - WINDOW + 1, device=DEV)  # held by the ring, seen by no query
    kc[table[stale // BS % RING], stale % BS] = float("inf")
    vc[table[stale // BS % RING], stale % BS] = float("inf")
    assert_rows_close(run_kernel(st, "ring"), reference(st, "ring"), TOL[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_write_kv_skips_minus_one(dtype):
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(2, 6, 2, D, generator=g).to(dtype)
    kc = torch.full((4, BS, 2, D), 7.0, dtype=dtype)
    vc = kc.clone()
    slots = torch.tensor([5, -1, 16 * 3 + 15, -1, 0, 17])
    kd, vd = kc.to(DEV), vc.to(DEV)
    write_kv(k.to(DEV), v.to(DEV), kd, vd, slots.to(DEV))
    want_k, want_v = kc.view(-1, 2, D).clone(), vc.view(-1, 2, D).clone()
    keep = slots >= 0
    want_k[slots[keep]], want_v[slots[keep]] = k[keep], v[keep]
    assert torch.equal(kd.cpu().view(-1, 2, D), want_k) and torch.equal(vd.cpu().view(-1, 2, D), want_v)
    assert (kd.cpu().view(-1, 2, D)[1] == 7.0).all()  # slot 1 was nobody's: untouched


def test_rejects_mismatched_shapes():
    q = torch.zeros(1, 16, D)
    kv = torch.zeros(1, 3, D)
    cache = torch.zeros(2, BS, 2, D)
    args = (
        torch.zeros(1, 1, dtype=torch.int32),
        torch.tensor([0, 1], dtype=torch.int32),
        torch.zeros(1, dtype=torch.int32),
        torch.zeros(16),
        SCALE,
        None,
        None,
        1,
    )
    with pytest.raises(ValueError, match="shapes disagree"):
        paged_attention(q, kv, kv, cache, cache, *args)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("batch", [1, 64, 256])
@pytest.mark.parametrize("ctx", [1024, 8192])
def test_gpu_decode_full_shapes(batch, ctx):
    for pool in ("full", "ring"):
        lens = [max(1, ctx - 37 * i % 900) for i in range(batch)]  # mixed lengths near ctx
        st = make_step(lens, [1] * batch, 64, 8, torch.bfloat16, seed=batch, fill=float("nan"))
        got = run_kernel(st, pool, max_context_hint=8192)
        assert_rows_close(got, reference(st, pool), TOL[torch.bfloat16])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("tokens", [1024, 4096])
def test_gpu_prefill_full_shapes(tokens):
    for pool in ("full", "ring"):
        st = make_step([0, 100], [tokens, 300], 64, 8, torch.bfloat16, seed=tokens, fill=float("nan"))
        assert_rows_close(run_kernel(st, pool), reference(st, pool), TOL[torch.bfloat16])

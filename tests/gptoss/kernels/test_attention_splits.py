"""Decode's split-K path and launch settings in Triton paged attention: how many splits a decode takes
(decode_splits, GPTOSS_ATTN_SPLIT_KEYS), the reduce of their partials (and its sm_90a load order), the
in-kernel merge (merge_in_kernel), the first tile preloaded before the PDL wait (preload_kv) and other
(BLOCK_N, warps, stages) settings (GPTOSS_ATTN_DECODE), each against test_attention_kernel's torch
reference or bit for bit against the plain path. Tolerances as there; interpreter on CPU, compiled
with CUDA.
"""

from __future__ import annotations

import pytest
import torch

from gptoss.kernels.attention import decode_splits
from tests.gptoss.kernels.conftest import sass_json
from tests.gptoss.kernels.test_attention_kernel import (  # conftest set TRITON_INTERPRET first
    BS,
    TOL,
    assert_rows_close,
    make_step,
    reference,
    run_kernel,
    table_tensor,
)

# The interpreter turns loop bounds into ints through a deprecated numpy conversion.
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")


def reread_settings():
    """gptoss.kernels.attention as a fresh process would make it under the environment now: its
    settings module read again, then attention, which takes its settings from there."""
    import importlib

    from gptoss.kernels import attention, attention_settings

    importlib.reload(attention_settings)
    return importlib.reload(attention)


@pytest.mark.parametrize("hint", [None, 200, 4096])
def test_decode_splits_and_neutral_partials(hint):
    """hint 200: one pass; None: the table's 19 blocks allow 304 keys, 2 splits; 4096: 16 splits,
    most of them with no keys (they must leave neutral partials)."""
    ctx = [300, 0, 129]
    st = make_step(ctx, [1] * 3, 16, 2, torch.float32, seed=7, fill=float("nan"))
    width = table_tensor(st["tables"]["full"]).shape[1]
    assert (width, decode_splits(3, 2, hint or width * BS)) == (19, {None: 2, 200: 1, 4096: 16}[hint])
    got = run_kernel(st, "full", max_context_hint=hint)
    assert_rows_close(got, reference(st, "full"), TOL[torch.float32])


@pytest.mark.parametrize("keys", [32, 48, 64])
def test_fewer_keys_a_split_give_more_splits_and_the_same_result(keys, monkeypatch):
    """GPTOSS_ATTN_SPLIT_KEYS lowers the bound: a lone sequence at a 4096-key hint takes 4096 / keys
    splits (capped at MAX_SPLITS) instead of 16, and its attention is unchanged. 48 at a 512-key
    hint: 11 splits, so the reduce's second tile of 8 splits holds 3 (merge_splits' masks)."""
    from gptoss.kernels import attention

    monkeypatch.setattr(attention, "MIN_SPLIT_KEYS", keys)
    assert decode_splits(1, 2, 4096) == 64
    assert decode_splits(1, 2, 512) == {32: 16, 48: 11, 64: 8}[keys]
    st = make_step([300], [1], 16, 2, torch.float32, seed=11, fill=float("nan"))
    got = run_kernel(st, "full", max_context_hint=512)
    assert_rows_close(got, reference(st, "full"), TOL[torch.float32])


def test_the_reduce_loads_sinks_and_query_start_before_the_pdl_wait():
    """Compiled for sm_90a on CPU (bench/kernels/pdl_wait_sass.py: 16 splits, a GQA group of 8):
    the sinks and the two query-start words load before griddepcontrol.wait (ACQBULK), the
    partials after it; the release after the wait; no spills at 8 splits a [G, 8, D] tile."""
    got = sass_json("pdl_wait_sass.py")["attention reduce"]
    assert got["ldg_before_wait"] >= 3 and got["ldg_after_wait"] > 0
    assert got["spills"] == 0 and got["wait_then_release"]


def test_split_keys_env_parses_and_refuses_bad_values():
    from gptoss.kernels import attention_settings

    assert [attention_settings._split_keys_from_env(v) for v in (None, "", "64", "16")] == [256, 256, 64, 16]
    for bad in ("8", "x", "-64", "64.0"):
        with pytest.raises(ValueError, match=f"GPTOSS_ATTN_SPLIT_KEYS must be .*got '{bad}'"):
            attention_settings._split_keys_from_env(bad)
    small = "GPTOSS_ATTN_SMALL_SPLIT_KEYS"
    assert attention_settings._split_keys_from_env(None, small, 256) == 256  # the module default
    with pytest.raises(ValueError, match=f"{small} must be .*got '8'"):
        attention_settings._split_keys_from_env("8", small, 32)


def test_small_launches_split_a_tile_of_keys_each(monkeypatch):
    """A launch of <= SMALL_DECODE sequences (small) splits at SMALL_SPLIT_KEYS, here v37's 32 on
    a 32-key DECODE_CFG tile (the default is one 256-key tile at 256): a 128-key sliding window into
    4 splits of one tile (256: one split), a lone sequence at a 4096-key hint into MAX_SPLITS; larger
    launches and the batch-invariant mode (small False) keep 256. A sliding layer's batch-1 decode
    then merges its 4 splits in the kernel, each tile preloaded, and equals the reference."""
    from gptoss.kernels import attention

    monkeypatch.setattr(attention, "SMALL_SPLIT_KEYS", 32)
    monkeypatch.setattr(attention, "SMALL_DECODE_CFG", None)
    monkeypatch.setattr(attention, "DECODE_CFG", (32, 2, 3))
    splits, tickets = [], []
    split_fn, ticket_fn = attention.decode_splits, attention._ticket_buffer
    monkeypatch.setattr(attention, "decode_splits", lambda *a: splits.append(split_fn(*a)) or splits[-1])
    monkeypatch.setattr(attention, "_ticket_buffer", lambda dev, n: tickets.append(n) or ticket_fn(dev, n))
    st = make_step([300], [1], 16, 2, torch.bfloat16, seed=13, fill=float("nan"))
    got = run_kernel(st, "ring", max_context_hint=4096)
    assert splits == [4] and tickets == [2]  # merged in the kernel, a ticket a (sequence, KV head)
    assert_rows_close(got, reference(st, "ring"), TOL[torch.bfloat16])
    assert [decode_splits(1, 8, 128, small=s) for s in (True, False)] == [4, 1]
    assert [decode_splits(1, 8, 4096, small=s) for s in (True, False)] == [64, 16]
    assert decode_splits(8, 8, 128, small=True) == 4 and decode_splits(16, 8, 4096) == 5


@pytest.mark.parametrize("cfg", [(16, 4, 4), (64, 4, 3), (128, 4, 2)], ids=str)
def test_decode_launch_settings_keep_the_result(cfg, monkeypatch):
    """Other (BLOCK_N, warps, stages) than DECODE_CFG's, as GPTOSS_ATTN_DECODE sets them: the same
    attention, split (hint 4096: chunks of BLOCK_N keys) or not, full table or ring."""
    import gptoss.kernels.attention as attention

    monkeypatch.setattr(attention, "DECODE_CFG", cfg)
    monkeypatch.setattr(attention, "SMALL_DECODE_CFG", None)  # a small launch: DECODE_CFG's settings
    st = make_step([300, 5, 129], [1] * 3, 16, 2, torch.float32, seed=11, fill=float("nan"))
    for pool in ("full", "ring"):
        assert_rows_close(
            run_kernel(st, pool, max_context_hint=4096), reference(st, pool), TOL[torch.float32]
        )


def test_decode_settings_from_the_environment(monkeypatch):
    from gptoss.kernels.attention_settings import _cfg_from_env

    monkeypatch.setenv("GPTOSS_ATTN_DECODE", "128,8,2")
    assert _cfg_from_env("GPTOSS_ATTN_DECODE", (64, 4, 3)) == (128, 8, 2)
    monkeypatch.setenv("GPTOSS_ATTN_DECODE", "")
    assert _cfg_from_env("GPTOSS_ATTN_DECODE", (64, 4, 3)) == (64, 4, 3)
    for bad, why in [
        ("64,4", "three positive counts"),
        ("64,x,3", "three positive counts"),
        ("48,4,3", "power of two >= 16"),
        ("64,3,3", "power of two"),
    ]:
        monkeypatch.setenv("GPTOSS_ATTN_DECODE", bad)
        with pytest.raises(ValueError, match=why):
            _cfg_from_env("GPTOSS_ATTN_DECODE", (64, 4, 3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("hint", [None, 4096])
@pytest.mark.parametrize("pool", ["full", "ring"])
def test_decode_preload_of_the_first_tile_gives_the_same_bits(pool, hint, dtype):
    """preload_kv (GPTOSS_ATTN_PRELOAD): each program's first BLOCK_N cached keys and values, loaded
    before its PDL wait and run as a masked tile ahead of the key loop, give the output bits of the
    loop alone: empty contexts and splits, a range shorter than a tile, ranges of many tiles, the
    window's edge (ring), 16 splits (hint 4096) or one pass. Six sequences: within SMALL_DECODE. The
    tile takes the unmasked step where the loop would (a tile every row sees whole): compiled, the
    masked step's last bits differ in float32 (an H200, v33)."""
    from gptoss.kernels import attention

    ctx = [300, 0, 129, 17, 31, 200]
    assert len(ctx) <= attention.SMALL_DECODE
    st = make_step(ctx, [1] * len(ctx), 16, 2, dtype, seed=13, fill=float("nan"))
    want = run_kernel(st, pool, max_context_hint=hint, preload_kv=False)
    got = run_kernel(st, pool, max_context_hint=hint, preload_kv=True)
    assert not want.isnan().any() and torch.equal(got, want)


class _LaunchRecorder:
    """Stands in for attention._attn_kernel: records each launch's grid and compile-time settings
    (`keys` of its keywords), then runs it."""

    def __init__(self, kernel, keys=("MERGE", "PRE_KV", "SPLIT")):
        self.kernel, self.keys, self.launches = kernel, keys, []

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.launches.append({"grid": grid, **{k: kw[k] for k in self.keys}})
            return self.kernel[grid](*args, **kw)

        return launch


@pytest.mark.parametrize(
    ("reduce", "preload", "want_small", "want_large"),
    [
        ("small", "1", (True, True), (False, False)),  # the defaults
        ("fused", "0", (True, False), (True, False)),
        ("split", "1", (False, True), (False, False)),
    ],
)
def test_small_decodes_merge_in_kernel_and_preload_by_default(
    monkeypatch, reduce, preload, want_small, want_large
):
    """GPTOSS_ATTN_REDUCE / GPTOSS_ATTN_PRELOAD as the module reads them: the in-kernel merge and the
    first tile's preload (MERGE, PRE_KV) for split decode launches of <= SMALL_DECODE sequences by
    default, neither above; fused merges every split launch; 0 and split turn them off."""

    monkeypatch.setenv("GPTOSS_ATTN_REDUCE", reduce)
    monkeypatch.setenv("GPTOSS_ATTN_PRELOAD", preload)
    fresh = reread_settings()
    try:
        assert (fresh.REDUCE, fresh.PRELOAD_KV) == (reduce, preload == "1")
        rec = _LaunchRecorder(fresh._attn_kernel)
        monkeypatch.setattr(fresh, "_attn_kernel", rec)
        seen = []
        for n in (fresh.SMALL_DECODE, fresh.SMALL_DECODE + 1):
            st = make_step(
                [40 + 7 * i for i in range(n)], [1] * n, 16, 2, torch.bfloat16, seed=n, fill=float("nan")
            )
            got = run_kernel(st, "full", max_context_hint=4096)
            assert_rows_close(got, reference(st, "full"), TOL[torch.bfloat16])
            (launch,) = rec.launches[-1:]
            assert launch["SPLIT"]
            seen.append((launch["MERGE"], launch["PRE_KV"]))
        assert seen == [want_small, want_large]
        # --batch-invariant: a small launch takes the large one's settings (none chosen by batch size)
        n = fresh.SMALL_DECODE
        st = make_step(
            [40 + 7 * i for i in range(n)], [1] * n, 16, 2, torch.bfloat16, seed=n, fill=float("nan")
        )
        got = run_kernel(st, "full", max_context_hint=4096, batch_invariant=True)
        assert_rows_close(got, reference(st, "full"), TOL[torch.bfloat16])
        assert (rec.launches[-1]["MERGE"], rec.launches[-1]["PRE_KV"]) == want_large
    finally:
        monkeypatch.undo()
        reread_settings()


def test_attention_switches_refuse_unknown_values(monkeypatch):
    from gptoss.kernels.attention_settings import _choice_from_env

    monkeypatch.setenv("GPTOSS_ATTN_REDUCE", "")
    assert _choice_from_env("GPTOSS_ATTN_REDUCE", ("small", "fused", "split")) == "small"
    monkeypatch.setenv("GPTOSS_ATTN_REDUCE", "fuse")
    with pytest.raises(ValueError, match="GPTOSS_ATTN_REDUCE='fuse': expected one of small, fused, split"):
        _choice_from_env("GPTOSS_ATTN_REDUCE", ("small", "fused", "split"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("hint", [None, 4096])
def test_decode_merges_splits_in_kernel_as_the_reduce_does(hint, dtype):
    """merge_in_kernel: the last split program of each (sequence, KV head) merges the partials (a
    ticket per pair, zeroed again for the next launch) and gives the reduce kernel's output bits;
    twice in a row, so the tickets left by the first launch serve the second."""
    from gptoss.kernels import attention

    ctx = [300, 0, 129, 17]
    st = make_step(ctx, [1] * 4, 16, 2, dtype, seed=11, fill=float("nan"))
    want = run_kernel(st, "full", max_context_hint=hint, merge_in_kernel=False)
    for _ in range(2):
        got = run_kernel(st, "full", max_context_hint=hint, merge_in_kernel=True)
        assert torch.equal(got, want)
        assert not attention._tickets[got.device].any()  # every ticket back to zero
    assert_rows_close(got, reference(st, "full"), TOL[dtype])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("batch", [1, 64])
def test_gpu_decode_merge_in_kernel(batch):
    """Compiled, 64 splits at batch 1: the in-kernel merge equals the reduce kernel's output, launch
    after launch (a partial read before its store was visible would show as a moving error)."""
    lens = [max(1, 8000 - 37 * i % 900) for i in range(batch)]
    st = make_step(lens, [1] * batch, 64, 8, torch.bfloat16, seed=batch, fill=float("nan"))
    want = run_kernel(st, "full", max_context_hint=131072, merge_in_kernel=False)
    for _ in range(20):
        assert torch.equal(run_kernel(st, "full", max_context_hint=131072, merge_in_kernel=True), want)


class _PartialsRecorder:
    """Stands in for attention._attn_kernel: fills the split partials (m, l, acc) with a sentinel
    before each launch, so the test sees which splits wrote theirs; records LIVE and the grid."""

    SENTINEL = 12345.0

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, []

    def __getitem__(self, grid):
        def launch(*args, **kw):
            pm, pl, pacc = args[10:13]
            for t in (pm, pl, pacc):
                t.fill_(self.SENTINEL)
            self.kernel[grid](*args, **kw)
            self.launches.append({"grid": grid, "LIVE": kw["LIVE"], "pm": pm.clone(), "pacc": pacc.clone()})

        return launch


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_merge_reads_only_the_live_splits(monkeypatch, dtype):
    """GPTOSS_ATTN_LIVE (LIVE_SPLITS): a small launch under a 4096-key hint at 256-key splits takes
    16 splits; contexts of 300, 0, 129 and 17 keys (+1 new) fill 10, 1, 5 and 1 of them (chunks of
    cdiv(keys, 16) rounded up to BLOCK_N's 32). Those write partials, the other splits return
    before any store (their partials keep the sentinel), and the merge gives the bits of the launch
    that writes all 16 and merges them in the kernel (LIVE off), which are the reduce kernel's; the
    tickets are back to zero."""
    from gptoss.kernels import attention

    monkeypatch.setattr(attention, "SMALL_DECODE_CFG", None)  # DECODE_CFG's tile, at 32 keys here
    monkeypatch.setattr(attention, "DECODE_CFG", (32, 2, 3))
    monkeypatch.setattr(attention, "SMALL_SPLIT_KEYS", 256)
    rec = _PartialsRecorder(attention._attn_kernel)
    monkeypatch.setattr(attention, "_attn_kernel", rec)
    ctx = [300, 0, 129, 17]
    st = make_step(ctx, [1] * 4, 16, 2, dtype, seed=5, fill=float("nan"))
    got = run_kernel(st, "full", max_context_hint=4096)
    monkeypatch.setattr(attention, "LIVE_SPLITS", False)
    want = run_kernel(st, "full", max_context_hint=4096)
    live, full = rec.launches
    assert (live["LIVE"], full["LIVE"], live["grid"]) == (True, False, (16, 4, 2))
    wrote = (live["pm"] != rec.SENTINEL).all(dim=1)  # [S, splits]: every head of the pair wrote
    n_live = torch.tensor([10, 1, 5, 1])
    assert torch.equal(wrote.cpu(), torch.arange(16)[None, :] < n_live[:, None])
    assert (live["pacc"][:, :, 10:] == rec.SENTINEL).all() and (full["pm"] != rec.SENTINEL).all()
    assert not want.isnan().any() and torch.equal(got, want)
    assert not attention._tickets[got.device].any()
    assert_rows_close(got, reference(st, "full"), TOL[dtype])


def test_small_launches_take_their_own_tile(monkeypatch):
    """SMALL_DECODE_CFG (GPTOSS_ATTN_SMALL_DECODE): launches of <= SMALL_DECODE sequences take a
    128-key tile on 4 warps, here with SMALL_SPLIT_KEYS 128. A batch-1 sliding layer's 128-key window
    is then one split (no partials, no tickets), a full layer under a 4096-key hint 32 splits of which
    a 300-key context fills 3; larger launches keep DECODE_CFG. Each equals the reference."""
    from gptoss.kernels import attention

    monkeypatch.setattr(attention, "SMALL_DECODE_CFG", (128, 4, 2))
    monkeypatch.setattr(attention, "SMALL_SPLIT_KEYS", 128)
    rec = _LaunchRecorder(attention._attn_kernel, ("BLOCK_N", "num_warps", "SPLIT", "MERGE"))
    monkeypatch.setattr(attention, "_attn_kernel", rec)
    st = make_step([300], [1], 16, 2, torch.bfloat16, seed=17, fill=float("nan"))
    for pool in ("ring", "full"):
        assert_rows_close(
            run_kernel(st, pool, max_context_hint=4096), reference(st, pool), TOL[torch.bfloat16]
        )
    n = attention.SMALL_DECODE + 1
    big = make_step([40 + 7 * i for i in range(n)], [1] * n, 16, 2, torch.bfloat16, seed=3, fill=float("nan"))
    assert_rows_close(
        run_kernel(big, "full", max_context_hint=4096), reference(big, "full"), TOL[torch.bfloat16]
    )
    bn, w, _ = attention.DECODE_CFG
    got = [(r["grid"][0], r["BLOCK_N"], r["num_warps"], r["SPLIT"], r["MERGE"]) for r in rec.launches]
    assert got == [(1, 128, 4, False, False), (32, 128, 4, True, True), (16, bn, w, True, False)]


def test_small_decode_settings_from_the_environment(monkeypatch):
    """GPTOSS_ATTN_SMALL_DECODE as the module reads it: unset, a 128-key tile on 4 warps, one stage
    (v44); set, its three counts; a bad value is refused by name."""

    try:
        monkeypatch.delenv("GPTOSS_ATTN_SMALL_DECODE", raising=False)
        monkeypatch.delenv("GPTOSS_ATTN_SMALL_SPLIT_KEYS", raising=False)
        assert reread_settings().SMALL_DECODE_CFG == (128, 4, 1)
        assert reread_settings().SMALL_SPLIT_KEYS == 128
        monkeypatch.setenv("GPTOSS_ATTN_SMALL_DECODE", "128,4,2")
        assert reread_settings().SMALL_DECODE_CFG == (128, 4, 2)
        monkeypatch.setenv("GPTOSS_ATTN_SMALL_DECODE", "96,4,2")
        with pytest.raises(ValueError, match="GPTOSS_ATTN_SMALL_DECODE: BLOCK_N must be a power of two"):
            reread_settings()
    finally:
        monkeypatch.undo()
        reread_settings()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("cfg", [(32, 2, 3), (64, 4, 2), (128, 4, 1), (128, 8, 2), (256, 8, 1)], ids=str)
@pytest.mark.parametrize("pool", ["full", "ring"])
def test_gpu_small_launch_tiles_and_live_splits(cfg, pool, monkeypatch):
    """Compiled, 120b's heads (64 over 8), batch 1 at 130-4000 keys under a 4096-key hint, each small
    tile at its width of splits: the reference's rows, and with LIVE the bits of the launch that
    merges every split, launch after launch (a partial read before its store shows as a moving error)."""
    from gptoss.kernels import attention

    monkeypatch.setattr(attention, "SMALL_DECODE_CFG", cfg)
    monkeypatch.setattr(attention, "SMALL_SPLIT_KEYS", cfg[0])
    for ctx in (130, 640, 4000):
        st = make_step([ctx], [1], 64, 8, torch.bfloat16, seed=ctx, fill=float("nan"))
        monkeypatch.setattr(attention, "LIVE_SPLITS", False)
        want = run_kernel(st, pool, max_context_hint=4096)
        monkeypatch.setattr(attention, "LIVE_SPLITS", True)
        assert_rows_close(want, reference(st, pool), TOL[torch.bfloat16])
        for _ in range(10):
            assert torch.equal(run_kernel(st, pool, max_context_hint=4096), want)


def test_float32_small_launches_take_half_a_256_key_tile(monkeypatch):
    """A small tile of 256 keys on 8 warps (the default until v44): float32 q halves it to 128 (256
    float32 keys need more shared memory than an H200 has, compiled), bf16 keeps it. Both equal the
    reference."""
    from gptoss.kernels import attention

    monkeypatch.setattr(attention, "SMALL_DECODE_CFG", (256, 8, 1))
    monkeypatch.setattr(attention, "SMALL_SPLIT_KEYS", 256)
    rec = _LaunchRecorder(attention._attn_kernel, ("BLOCK_N", "num_warps"))
    monkeypatch.setattr(attention, "_attn_kernel", rec)
    for dtype in (torch.float32, torch.bfloat16):
        st = make_step([300], [1], 16, 2, dtype, seed=19, fill=float("nan"))
        assert_rows_close(run_kernel(st, "full", max_context_hint=4096), reference(st, "full"), TOL[dtype])
    assert [(r["BLOCK_N"], r["num_warps"]) for r in rec.launches] == [(128, 8), (256, 8)]

"""bench/decode_ab_gpu.py's variants: the switches it sets between captures and restores afterwards.
A variant that sets the wrong switch, or leaves one set for the next, makes a device call's A/B
table compare the wrong things, so the parsing and the restore are tested here on CPU."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from decode_ab_gpu import Switches, parse_batches, parse_variant  # noqa: E402

from gptoss.kernels import attention, moe_tiles, moe_v3_dec_gu  # noqa: E402
from gptoss.kernels.moe_tiles import DecTiles, Tiles  # noqa: E402


def test_a_variant_names_attributes_dict_items_and_tile_shapes():
    name, sets = parse_variant(
        "gu=moe_v3_dec_gu.TOKENS=frozenset({1,2})+moe_v3_dec_gu.V3_GATE_UP_DEC=DecTiles(16,32,128,2,2,4)"
        "+moe_tiles.TILE_OVERRIDE[(0,True)]=Tiles(16,32,128,4,8)+attention.DECODE_CFG=(16,2,3)"
        "+gptoss.kernel_model.ROUTER='split'"
    )
    assert name == "gu"
    assert sets == [
        ("gptoss.kernels.moe_v3_dec_gu", "TOKENS", None, frozenset({1, 2})),
        ("gptoss.kernels.moe_v3_dec_gu", "V3_GATE_UP_DEC", None, DecTiles(16, 32, 128, 2, 2, 4)),
        ("gptoss.kernels.moe_tiles", "TILE_OVERRIDE", (0, True), Tiles(16, 32, 128, 4, 8)),
        ("gptoss.kernels.attention", "DECODE_CFG", None, (16, 2, 3)),
        ("gptoss.kernel_model", "ROUTER", None, "split"),  # a whole module name from gptoss. on
    ]
    assert parse_variant("default=") == ("default", [])


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nameonly", "expected NAME=\\[MOD.ATTR=VALUE"),
        ("x=MAX_T=1", "'MAX_T=1' is not MOD.ATTR\\[\\[KEY\\]\\]=VALUE"),
        ("x=attention.DECODE_CFG=fast", "'fast' is neither a Python literal, a tile shape nor a frozenset"),
        ("x=moe_v3_dec.TOKENS=frozenset(1)", "'frozenset\\(1\\)' is neither"),
        ("x=moe_v3_dec_gu.V3_GATE_UP_DEC=DecTiles(16,32)", "'DecTiles\\(16,32\\)' is neither"),
    ],
)
def test_a_malformed_variant_is_refused(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_variant(spec)


def test_switches_set_a_variant_and_restore_the_defaults_in_place():
    variants = dict(
        parse_variant(v)
        for v in (
            "default=",
            "a=moe_v3_dec_gu.TOKENS=frozenset()+moe_tiles.TILE_OVERRIDE[(0,True)]=Tiles(16,32,128,4,8)",
            "b=attention.MIN_SPLIT_KEYS=128",
        )
    )
    before = (moe_v3_dec_gu.TOKENS, attention.MIN_SPLIT_KEYS, dict(moe_tiles.TILE_OVERRIDE))
    override = moe_tiles.TILE_OVERRIDE  # other modules hold this dict: it must change in place
    sw = Switches(variants)
    try:
        sw.apply(variants["a"])
        assert moe_v3_dec_gu.TOKENS == frozenset() and attention.MIN_SPLIT_KEYS == before[1]
        assert moe_tiles.choose_tiles_v3(1, 4, 128, 2880, 2880, gate_up=True).stages == 8
        sw.apply(variants["b"])  # a's switches are undone before b's are set
        assert moe_v3_dec_gu.TOKENS == before[0] and attention.MIN_SPLIT_KEYS == 128
        assert moe_tiles.TILE_OVERRIDE == before[2] and moe_tiles.TILE_OVERRIDE is override
    finally:
        sw.apply([])
    assert (moe_v3_dec_gu.TOKENS, attention.MIN_SPLIT_KEYS, dict(moe_tiles.TILE_OVERRIDE)) == before


def test_batch_sizes_are_one_or_a_list_each_at_least_one():
    assert parse_batches("8") == [8] and parse_batches("2,3,5") == [2, 3, 5]
    for bad in ("0", "2,x", "", "3,-1"):
        with pytest.raises(argparse.ArgumentTypeError, match=f"{bad!r}: expected decode batch sizes"):
            parse_batches(bad)


def test_switches_refuse_what_does_not_exist():
    with pytest.raises(AttributeError, match="gptoss.kernels.moe_v3_dec_gu has no attribute 'MAX_T'"):
        Switches(dict([parse_variant("x=moe_v3_dec_gu.MAX_T=1")]))
    with pytest.raises(TypeError, match="gptoss.kernels.moe_v3_dec_gu.TOKENS is not a dict"):
        Switches(dict([parse_variant("x=moe_v3_dec_gu.TOKENS[0]=1")]))


def test_the_timed_and_profiled_steps_cover_the_whole_batch(tiny_checkpoint, monkeypatch):
    """decode_tok_s times every prompt together; profile_steps profiles exactly n decode steps of
    the prompts together, after their prefill, divides by them, and leaves the engine empty (on CPU
    the profiler sees no kernels: a stand-in gives 10 µs added and 20 idle over the steps)."""
    import decode_ab_gpu
    from decode_ab_gpu import decode_tok_s, profile_steps

    from gptoss.engine import EngineConfig, LLMEngine

    eng = LLMEngine(EngineConfig(model_path=tiny_checkpoint, device="cpu", max_model_len=256))
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    calls = []
    generate = eng.generate
    eng.generate = lambda ps, sp: calls.append((len(ps), sp.max_new_tokens)) or generate(ps, sp)
    assert decode_tok_s(eng, prompts, 6) > 0
    assert calls == [(2, 8), (2, 6), (2, 6), (2, 6)]
    steps = []
    step = eng.step
    eng.step = lambda: steps.append(len(eng.seqs)) or step()
    monkeypatch.setattr(decode_ab_gpu, "_kernel_times", lambda prof: ({"k": [0.0, 0, 10.0]}, 20.0))
    per, idle = profile_steps(eng, prompts, 5)
    assert per == {"k": 2.0} and idle == 4.0  # over 5 steps
    assert not eng.has_work() and eng.seqs == {}
    assert steps.count(2) >= 5 + 1  # both prompts in every profiled step and the one before it


def test_the_table_sums_a_shown_kernel_by_name_prefix():
    """--show KERNEL: the µs added a step by every kernel whose name starts with it, 0.0 where none ran."""
    from decode_ab_gpu import shown_us

    per = {"_attn_kernel": 10.5, "_attn_kernel_ring": 1.5, "_rmsnorm_kernel": 3.0}
    assert (shown_us(per, "_attn_kernel"), shown_us(per, "_rms"), shown_us(per, "_gate")) == (12.0, 3.0, 0.0)


def test_the_planned_and_timed_variants_name_switches_that_exist_with_their_types():
    """bench/results' planned calls (v41's next batch-4 runs), v41's, v42's, v47's and v48's timed ones (v47's
    in today's names: MAX_T became TOKENS, a set of batch sizes): each switch is a
    module attribute of the value's type, so a rename fails here, not after a device call has loaded a
    120b."""
    import importlib

    plan = (
        "t8=gptoss.kernel_model.DECODE_ON_LARGE=frozenset({1,2,3,4,5,6,7,8})"
        "+moe_v3_dec_gu.TOKENS=frozenset({1,2,3,4,5,6,7,8})+moe_v3_dec.TOKENS=frozenset({1,2,3,4,5,6,7,8})",
        "old=decode_advance.ARGMAX='torch'+gptoss.kernel_model.EMBED_IN_NORM=False",
        "gu16=moe_v3_dec_gu.V3_GATE_UP_DEC=DecTiles(16,16,256,2,2,4)",
        "dn16=moe_v3_dec.V3_DOWN_DEC=DecTiles(16,16,256,2,2,3)",
        "old=attention.NEW_KEYS_N=0",
        "dn4=moe_v3_dec.V3_DOWN_DEC=DecTiles(16,32,512,4,4,4)",
        # v48's ladder before every size to 8 (it ran as gptoss.kernel_runner's, before the move)
        "l4=gptoss.decode_graphs.GRAPH_SIZES=(1,2,4,8,12,16)",
        # v48's next runs: split-K at 12 and 16 tokens on a tile of their own, and at 3
        "sk=moe_v3_dec_gu.TOKENS=frozenset({1,2,5,6,7,8,12,16})+moe_v3_dec.TOKENS=frozenset({1,2,5,6,7,8,12,16})"
        "+gptoss.kernel_model.DECODE_ON_LARGE=frozenset({1,2,5,6,7,8,12,16})"
        "+moe_v3_dec.V3_DOWN_DEC=DecTiles(16,16,256,2,2,2)",
        "sk3=moe_v3_dec_gu.TOKENS=frozenset({1,2,3,5,6,7,8})+moe_v3_dec.TOKENS=frozenset({1,2,3,5,6,7,8})"
        "+gptoss.kernel_model.DECODE_ON_LARGE=frozenset({1,2,3,5,6,7,8})",
    )
    for spec in plan:
        for mod, attr, _, value in parse_variant(spec)[1]:
            assert type(getattr(importlib.import_module(mod), attr)) is type(value), (spec, attr)


def test_each_batch_times_every_variant_on_graphs_built_under_its_switches(monkeypatch):
    """--batch 3,5: per batch size and round, each variant's switches are set, then the graphs are
    built (the ladder read then), then timed; one table a size names every variant. A runner that only
    records the ladder it would build stands in for the GPU's (on CPU there are no graphs to capture)."""
    from types import SimpleNamespace

    import decode_ab_gpu

    from gptoss import decode_graphs

    built: list[list[int]] = []
    runner = SimpleNamespace(
        graphs=SimpleNamespace(build=lambda: built.append(decode_graphs.graph_ladder(8)))
    )
    timed: list[tuple[int, list[int]]] = []

    def fake_tok_s(eng, prompts, out_len, sampling):
        timed.append((len(prompts), built[-1]))
        return 100.0 * len(prompts)

    monkeypatch.setattr(decode_ab_gpu, "decode_tok_s", fake_tok_s)
    variants = dict(
        parse_variant(v) for v in ("default=", "l4=gptoss.decode_graphs.GRAPH_SIZES=(1,2,4,8,12,16)")
    )
    args = SimpleNamespace(rounds=2, profile_tokens=0, show=[], sampling={})
    switches = Switches(variants)
    tables = [decode_ab_gpu.time_batch(None, runner, switches, variants, args, b, 128, 16) for b in (3, 5)]
    every, old = list(range(1, 9)), [1, 2, 4, 8]
    assert timed == [(3, every), (3, old), (3, every), (3, old), (5, every), (5, old), (5, every), (5, old)]
    assert decode_graphs.GRAPH_SIZES[:8] == (1, 2, 3, 4, 5, 6, 7, 8)  # restored after each size
    assert tables[0].splitlines()[0].startswith("batch 3, 128 -> 16 tokens, greedy")
    assert [line.split()[:4] for line in tables[1].splitlines()[1:]] == [
        ["default", "500.0", "/", "500.0"],
        ["l4", "500.0", "/", "500.0"],
    ]


def test_sampling_is_greedy_or_the_requests_own_filters(tiny_checkpoint):
    """--sampling: greedy by default, else each timed request's temperature / top_p / top_k / seed
    (checked as SamplingParams checks them); decode_tok_s asks them of every timed request."""
    import argparse

    from decode_ab_gpu import decode_tok_s, parse_sampling

    from gptoss.engine import EngineConfig, LLMEngine

    assert parse_sampling("greedy") == {}
    assert parse_sampling("temperature=1,top_p=0.9,top_k=20,seed=3") == {
        "temperature": 1.0,
        "top_p": 0.9,
        "top_k": 20,
        "seed": 3,
    }
    for bad, msg in (
        ("top_p=1.5", "top_p must be in"),
        ("min_p=0.1", "expected greedy"),
        ("top_k=x", "'top_k=x'"),
    ):
        with pytest.raises(argparse.ArgumentTypeError, match=msg):
            parse_sampling(bad)
    eng = LLMEngine(EngineConfig(model_path=tiny_checkpoint, device="cpu", max_model_len=256))
    seen = []
    generate = eng.generate
    eng.generate = lambda ps, sp: seen.append((sp.temperature, sp.top_p, sp.ignore_eos)) or generate(ps, sp)
    assert decode_tok_s(eng, [[5, 6, 7]], 4, parse_sampling("temperature=0.8,top_p=0.5")) > 0
    assert seen == [(0.8, 0.5, True)] * 4

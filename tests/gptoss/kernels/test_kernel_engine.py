"""The engine on the Triton kernels against the torch reference engine on the tiny model cut to 2
layers and 6000 tokens (conftest.kernel_checkpoint), in float32: same greedy tokens through chunked
prefill, the 128-token window and mixed decode+prefill steps (seeded sampling:
test_kernel_engine_sampling.py). On CPU the kernels run in Triton's interpreter; on a GPU the same
test runs them compiled, decode steps replaying CUDA graphs."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("triton")

from gptoss.engine import EngineConfig, LLMEngine  # noqa: E402
from gptoss.sampling import SamplingParams  # noqa: E402
from tests.gptoss.kernels.conftest import DEVICE, VOCAB, count_calls, record_launches  # noqa: E402


def prompts_of(lengths, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(n)] for n in lengths]


def make_engine(path, kernels, **kw):
    kw = {
        "dtype": "float32",
        "max_num_seqs": 4,
        "max_num_batched_tokens": 64,
        "kv_cache_tokens": 1024,
        "device": DEVICE,
    } | kw
    return LLMEngine(EngineConfig(path, kernels=kernels, **kw))


@pytest.fixture(scope="module")
def engines(kernel_checkpoint):
    return make_engine(kernel_checkpoint, "triton"), make_engine(kernel_checkpoint, "torch")


def test_triton_greedy_equals_torch_reference(engines):
    triton_eng, torch_eng = engines
    assert triton_eng.runner.kernel_runner is not None and torch_eng.runner.kernel_runner is None
    # 150 > the 64-token budget: chunked prefill with context, crossing the 128 window (ring);
    # 5 prompts > max_num_seqs 4: one waits, so decodes and a prefill share steps.
    prompts = prompts_of([1, 17, 150, 40, 5], seed=3)
    params = [SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True) for n in (6, 9, 4, 8, 7)]
    got = triton_eng.generate(prompts, params)
    want = torch_eng.generate(prompts, params)
    assert got == want
    assert [len(g) for g in got] == [6, 9, 4, 8, 7]
    bm = triton_eng.scheduler.bm
    assert bm.full.num_free == bm.full.num_blocks


@pytest.mark.parametrize("router", ["split", "norm", "fused"])
def test_decode_routers_give_the_reference_tokens(kernel_checkpoint, engines, monkeypatch, router):
    """GPTOSS_ROUTER's decode routers: F.linear + the routing kernel, norm_route (add+RMSNorm + router
    GEMV, then the routing kernel) and norm_logits with the routing inside the gate_up GEMM (default:
    kernel_model.decode_rows, on the decode kernels' copy or, at DECODE_ON_LARGE's sizes on a GPU,
    the v3 copy's split-K gate_up)."""
    from gptoss import kernel_model

    monkeypatch.setattr(kernel_model, "ROUTER", router)
    calls = count_calls(
        monkeypatch,
        [
            (kernel_model, "norm_route", "norm_route"),
            (kernel_model, "decode_rows", "decode_rows"),
        ],
    )
    # A fresh engine without CUDA graphs: a graph captured before the patch would replay its router.
    triton_eng, torch_eng = make_engine(kernel_checkpoint, "triton", cuda_graphs=False), engines[1]
    prompts = prompts_of([3, 21], seed=8)
    params = [SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True) for n in (5, 4)]
    assert triton_eng.generate(prompts, params) == torch_eng.generate(prompts, params)
    if router == "split":
        assert calls == {"norm_route": 0, "decode_rows": 0}
    else:
        took = "norm_route" if router == "norm" else "decode_rows"
        assert calls[took] > 0 and sum(calls.values()) == calls[took]  # the decode steps took that router


def test_attention_split_merge_in_kernel_gives_the_reference_tokens(kernel_checkpoint, engines, monkeypatch):
    """GPTOSS_ATTN_REDUCE's default (small): decode steps of two sequences merge attention's split
    partials in the attention kernel."""
    from gptoss.kernels import attention

    monkeypatch.setattr(attention, "REDUCE", "small")
    merged = []
    buffer = attention._ticket_buffer

    def counted(device, n):
        got = buffer(device, n)
        merged.append(got is not None)
        return got

    monkeypatch.setattr(attention, "_ticket_buffer", counted)
    triton_eng, torch_eng = make_engine(kernel_checkpoint, "triton", cuda_graphs=False), engines[1]
    prompts = prompts_of([3, 21], seed=9)
    params = [SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True) for n in (5, 4)]
    assert triton_eng.generate(prompts, params) == torch_eng.generate(prompts, params)
    assert merged and all(merged)  # split decode launches took the in-kernel merge


def test_small_launch_tile_gives_the_reference_tokens(kernel_checkpoint, engines, monkeypatch):
    """attention.SMALL_DECODE_CFG (GPTOSS_ATTN_SMALL_DECODE) at a 128-key tile on 4 warps with
    128-key splits: decode steps of two sequences take that tile (a sliding layer's window in one
    split), and the tokens stay the reference's."""
    from gptoss.kernels import attention

    monkeypatch.setattr(attention, "SMALL_DECODE_CFG", (128, 4, 2))
    monkeypatch.setattr(attention, "SMALL_SPLIT_KEYS", 128)
    blocks = record_launches(monkeypatch, attention, "_attn_kernel", "BLOCK_N")
    triton_eng, torch_eng = make_engine(kernel_checkpoint, "triton", cuda_graphs=False), engines[1]
    prompts = prompts_of([3, 21], seed=12)
    params = [SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True) for n in (5, 4)]
    assert triton_eng.generate(prompts, params) == torch_eng.generate(prompts, params)
    assert 128 in blocks  # the decode launches took the small tile (prefill takes PREFILL_CFG's)


def test_three_sequences_decode_in_the_graph_of_three(engines, kernel_checkpoint, monkeypatch):
    """Every decode size up to 8 has its own graph: three sequences replay size 3's, with no padding
    row (a zero row routes by the router's bias alone and reads experts no sequence chose). Under the
    old ladder (1, 2, 4, ...) they replay 4's, and both give the reference tokens."""
    from gptoss import decode_graphs

    triton_eng, torch_eng = engines
    graphs = triton_eng.runner.kernel_runner.graphs
    assert graphs.sizes == [1, 2, 3, 4]  # max_num_seqs 4
    replayed = []
    replay = decode_graphs.DecodeGraph.replay
    monkeypatch.setattr(decode_graphs.DecodeGraph, "replay", lambda g: replayed.append(g.size) or replay(g))
    prompts = prompts_of([7, 11, 5], seed=9)
    sp = SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)
    want = torch_eng.generate(prompts, sp)
    assert triton_eng.generate(prompts, sp) == want
    assert replayed and set(replayed) == {3}
    replayed.clear()
    monkeypatch.setattr(decode_graphs, "GRAPH_SIZES", (1, 2, 4, 8))
    try:
        graphs.build()
        assert graphs.sizes == [1, 2, 4]
        assert triton_eng.generate(prompts, sp) == want
        assert replayed and set(replayed) == {4}
    finally:
        monkeypatch.undo()
        graphs.build()
    assert graphs.sizes == [1, 2, 3, 4]


def test_the_graph_ladder_is_every_size_to_8_then_steps_and_ends_at_max_num_seqs():
    from gptoss.decode_graphs import graph_ladder

    assert graph_ladder(1) == [1]
    assert graph_ladder(8) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert graph_ladder(20) == [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 20]
    assert (
        graph_ladder(1024)[-3:] == [768, 896, 1024] and len(graph_ladder(1024)) == 30
    )  # 26 before 3, 5, 6, 7


def test_multi_step_decode_equals_single_steps_and_drops_tokens_past_a_stop(engines, kernel_checkpoint):
    multi, _ = engines  # decode_steps 8 (the default): pure decode batches run 8 steps per round trip
    single = make_engine(kernel_checkpoint, "triton", decode_steps=1)
    prompts = prompts_of([9, 20], seed=6)
    sp = [
        SamplingParams(max_new_tokens=11, temperature=1.0, seed=5, ignore_eos=True),
        SamplingParams(max_new_tokens=13, temperature=0.0, ignore_eos=True),
    ]
    want = single.generate(prompts, sp)
    assert multi.generate(prompts, sp) == want
    # A stop id met mid-window ends the request there; the ids computed after it are dropped.
    stop = want[1][4]
    cut = [SamplingParams(max_new_tokens=13, temperature=0.0, stop_token_ids=(stop,))]
    got = multi.generate(prompts[1:], cut)[0]
    assert got == want[1][: want[1].index(stop) + 1]
    bm = multi.scheduler.bm
    assert bm.full.num_free == bm.full.num_blocks and bm.ring.num_free == bm.ring.num_blocks


def test_v3_weights_for_every_batch_give_the_reference_tokens(kernel_checkpoint, engines, monkeypatch):
    """GPTOSS_MOE_KERNELS=v3: one v3 copy of the experts, no second copy and no decode kernels; every
    step's MoE runs the v3 GEMMs (120b's A/B: its Offline batches are 16-32 rows an expert). Decode
    steps route in the gate_up kernel (norm_logits, then moe.expert_rows_v3_logits: the default
    GPTOSS_ROUTER) and leave the combine to the next add + RMSNorm (moe.v3_decode), and so does the
    prefill step (kernel_model.COMBINE_IN_NORM): moe.combine runs only with that switched off."""
    from gptoss import kernel_model
    from gptoss.kernels import moe, moe_decode, moe_layout, moe_v3_dec_gu, moe_v3_dec_sizes

    monkeypatch.setattr(moe_layout, "KERNELS", "v3")
    monkeypatch.setattr(moe_v3_dec_gu, "TOKENS", frozenset({1}))  # 2-token steps on v3's gate_up first
    ran = count_calls(
        monkeypatch,
        [
            (moe, "gate_up_v3", "v3"),
            (moe_v3_dec_gu, "gate_up_v3_dec", "split-K"),
            (moe, "gate_up_v2", "v2"),
            (moe, "combine", "combine"),
            (kernel_model, "norm_logits", "norm_logits"),
            (kernel_model, "expert_rows_v3_logits", "rows"),
            (moe_decode, "experts_dec", "decode"),
            (moe_decode, "experts_dec_logits", "decode"),
        ],
    )
    triton_eng, torch_eng = make_engine(kernel_checkpoint, "triton", cuda_graphs=False), engines[1]
    moe_w = triton_eng.runner.kernel_runner.model.layers[0].moe
    assert (moe_w.layout, moe_w.large) == ("v3", None)
    ran.update(dict.fromkeys(ran, 0))  # on a GPU, start-up ran the MoE at 32 and 64 tokens (warm_moe)
    prompts = prompts_of([3, 21], seed=10)
    params = [SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True) for n in (5, 4)]
    assert triton_eng.generate(prompts, params) == torch_eng.generate(prompts, params)
    layers = len(triton_eng.runner.kernel_runner.model.layers)
    assert ran["v2"] == ran["decode"] == 0
    # one prefill step of 24 tokens (moe_rows: combined in the next norm), then 4 decode steps of 2
    # tokens (multi-step decode keeps both rows to the end), all on v3's gate_up
    assert ran["v3"] == 5 * layers and ran["split-K"] == 0
    assert ran["combine"] == 0 and ran["norm_logits"] == ran["rows"] == 4 * layers
    monkeypatch.setattr(kernel_model, "COMBINE_IN_NORM", False)  # GPTOSS_COMBINE_IN_NORM=0
    ran.update(dict.fromkeys(ran, 0))
    assert triton_eng.generate(prompts, params) == torch_eng.generate(prompts, params)
    assert ran["combine"] == layers and ran["v3"] == 5 * layers  # the prefill step's moe.combine
    monkeypatch.setattr(kernel_model, "COMBINE_IN_NORM", True)
    # one prompt: its decode steps of 1 token take the split-K gate_up (1 in moe_v3_dec_gu.TOKENS)
    ran.update(dict.fromkeys(ran, 0))
    one = [SamplingParams(max_new_tokens=3, temperature=0.0, ignore_eos=True)]
    assert triton_eng.generate(prompts[1:], one) == torch_eng.generate(prompts[1:], one)
    assert ran["v3"] == layers and ran["split-K"] == 2 * layers and ran["rows"] == 2 * layers
    # the default sizes (1, 2, 5-8): the two prompts' 2-token decode steps take the split-K gate_up too
    monkeypatch.setattr(moe_v3_dec_gu, "TOKENS", moe_v3_dec_sizes.SPLIT_K_TOKENS)
    ran.update(dict.fromkeys(ran, 0))
    assert triton_eng.generate(prompts, params) == torch_eng.generate(prompts, params)
    assert ran["v3"] == layers and ran["split-K"] == ran["rows"] == 4 * layers


@pytest.mark.skipif(DEVICE != "cuda", reason="linear() takes the decode GEMVs on CUDA tensors only")
def test_stream_gemv_gives_the_reference_tokens(kernel_checkpoint, engines, monkeypatch):
    """GPTOSS_GEMV=stream (the default): one- and two-token decode steps' projections on gemv_stream
    give the reference tokens; the spy sees it run."""
    from gptoss.kernels import linear as lin

    monkeypatch.setattr(lin, "GEMV", "stream")
    ran = count_calls(monkeypatch, [(lin, "gemv_stream", "stream")])
    triton_eng, torch_eng = make_engine(kernel_checkpoint, "triton", cuda_graphs=False), engines[1]
    prompts = prompts_of([7, 19], seed=18)
    params = [SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True) for n in (6, 4)]
    assert triton_eng.generate(prompts, params) == torch_eng.generate(prompts, params)
    assert ran["stream"] > 0


@pytest.mark.parametrize("on_large", [0, 1])
def test_decode_on_the_large_copy_gives_the_reference_tokens(
    kernel_checkpoint, engines, monkeypatch, on_large
):
    """Two copies of the experts (20b's: v2 and a v3 copy for large batches): with one token in
    GPTOSS_DECODE_ON_LARGE (the default's sizes include it) one-token decode steps run the v3 copy's
    split-K gate_up and down (120b's decode path) and no decode kernel on v2; with 0 the decode
    kernels on v2. The greedy tokens equal the reference's either way."""
    from gptoss import kernel_model
    from gptoss.kernels import moe_decode, moe_v3_dec, moe_v3_dec_gu

    monkeypatch.setattr(kernel_model, "moe_layouts", lambda ref: ("v2", "v3"))
    monkeypatch.setattr(kernel_model, "DECODE_ON_LARGE", frozenset({1, 2}) if on_large else frozenset())
    layouts: list[tuple[str, str]] = []
    for owner, name in ((moe_v3_dec_gu, "gate_up_v3_dec"), (moe_v3_dec, "down_v3_dec")):
        real = getattr(owner, name)

        def spy(x, r, w, *rest, _real=real, _name=name, **kw):
            layouts.append((_name, w.layout))
            return _real(x, r, w, *rest, **kw)

        monkeypatch.setattr(owner, name, spy)
    ran = count_calls(monkeypatch, [(moe_decode, "experts_dec_logits", "v2 decode")])
    triton_eng, torch_eng = make_engine(kernel_checkpoint, "triton", cuda_graphs=False), engines[1]
    moe_w = triton_eng.runner.kernel_runner.model.layers[0].moe
    assert (moe_w.layout, moe_w.large.layout) == ("bits", "v3")
    layouts.clear()
    ran.update(dict.fromkeys(ran, 0))
    prompts = prompts_of([13], seed=16)
    params = [SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)]
    assert triton_eng.generate(prompts, params) == torch_eng.generate(prompts, params)
    layers = len(triton_eng.runner.kernel_runner.model.layers)
    # The 13-token prefill is a decode size for v2's decode kernels (moe_decode.MAX_T) but not one of
    # DECODE_ON_LARGE's: it takes v2 either way; the 3 one-token steps follow the switch.
    if on_large:
        assert layouts == [("gate_up_v3_dec", "v3"), ("down_v3_dec", "v3")] * (3 * layers)
        assert ran["v2 decode"] == layers
    else:
        assert layouts == [] and ran["v2 decode"] == 4 * layers


def test_decode_on_large_refuses_a_bad_value_by_name():
    from gptoss import kernel_model
    from gptoss.kernels.moe_v3_dec_sizes import SPLIT_K_TOKENS

    parsed = [kernel_model._decode_on_large(v) for v in (None, "", "0", "4", "1-2,8")]
    assert parsed == [SPLIT_K_TOKENS, SPLIT_K_TOKENS, frozenset(), {1, 2, 3, 4}, {1, 2, 8}]
    for bad in ("x", "-1", "99", "1,99"):
        with pytest.raises(ValueError, match=r"^GPTOSS_DECODE_ON_LARGE must say which decode batch .* got "):
            kernel_model._decode_on_large(bad)


def test_one_token_routed_by_packed_keys_gives_the_reference_tokens(kernel_checkpoint, engines, monkeypatch):
    """GPTOSS_V3_DEC_GATE_UP_ROUTE_ONE=1 on one v3 copy: a one-token step's split-K gate_up routes the
    logits by moe_routing._topk_one; the down and the next norm's combine read what it stores."""
    from gptoss.kernels import moe_layout, moe_v3_dec_gu

    monkeypatch.setattr(moe_layout, "KERNELS", "v3")
    monkeypatch.setattr(moe_v3_dec_gu, "ROUTE_ONE", True)
    ones = record_launches(monkeypatch, moe_v3_dec_gu, "_gate_up_v3_dec_kernel", "ONE")  # packed keys ran
    triton_eng, torch_eng = make_engine(kernel_checkpoint, "triton", cuda_graphs=False), engines[1]
    ones.clear()  # the generate's launches, not the start-up warm-up's (on a GPU)
    prompts = prompts_of([13], seed=14)
    params = [SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)]
    assert triton_eng.generate(prompts, params) == torch_eng.generate(prompts, params)
    layers = len(triton_eng.runner.kernel_runner.model.layers)
    # the 13-token prefill, a decode size of the split-K kernels (SPLIT_K_TOKENS), routed by
    # route_and_group's launch (13 > BM 8) and so without packed keys; then the 3 decode steps' layers
    assert ones == [False] * layers + [True] * (3 * layers)


@pytest.mark.parametrize(
    ("name", "value", "error"),
    [
        ("GPTOSS_MOE_KERNELS", "v1", "GPTOSS_MOE_KERNELS='v1': unset (the default: v2 weights"),
        ("GPTOSS_MOE_LARGE_MIN_ROWS", "0", "GPTOSS_MOE_LARGE_MIN_ROWS='0': a whole number of rows"),
        ("GPTOSS_MOE_LARGE_MIN_ROWS", "6x", "GPTOSS_MOE_LARGE_MIN_ROWS='6x': a whole number of rows"),
    ],
)
def test_moe_layout_switches_refuse_bad_values_by_name(name, value, error):
    from gptoss.kernels import moe_layout

    parse = moe_layout._env_kernels if name == "GPTOSS_MOE_KERNELS" else lambda v: moe_layout._env_rows(v, 65)
    with pytest.raises(ValueError) as e:
        parse(value)
    assert str(e.value).startswith(error)


def test_moe_layout_switches_read_their_values():
    from gptoss.kernels import moe_layout

    assert [moe_layout._env_kernels(v) for v in (None, "", "v2", "v3")] == ["auto", "auto", "v2", "v3"]
    assert [moe_layout._env_rows(v, 65) for v in (None, "", "33")] == [65, 65, 33]


def test_info_times_each_start_up_phase_in_order(engines):
    """engine.info()["startup_s"]: the phases a start-up went through, in order, each timed (the bench's
    start-up row prints them); the torch engine has no kernel model or graphs to build. On a GPU the
    precompile is waited for before the kernel model, and the MoE and the engine warm up."""
    triton_eng, torch_eng = engines
    phases = triton_eng.info()["startup_s"]
    if DEVICE == "cuda":
        want = ["weights", "kv_cache", "precompile_wait", "kernel_model", "moe_warm", "graphs", "scheduler"]
        want.append("warmup")
    else:
        want = ["weights", "kv_cache", "kernel_model", "graphs", "scheduler"]
    assert list(phases) == want
    assert all(isinstance(s, float) and s >= 0 for s in phases.values())
    assert list(torch_eng.info()["startup_s"]) == ["weights", "kv_cache", "scheduler"]

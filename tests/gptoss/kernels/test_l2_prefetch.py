"""The L2 prefetches (gptoss.kernels.l2_prefetch, GPTOSS_L2_PREFETCH): the byte ranges each thread
asks for tile a tensor exactly, 16-aligned; the sm_90a code releases dependents before prefetching
and waits last; gate_up's prefetch stays out of its K loop; and the engine with every prefetch on
gives the reference tokens (on CPU the launches are no-ops, so there the plumbing is what is tested;
compiled on a GPU the prefetches run and the bits must not move)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated by triton.jit
triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from gptoss.kernels import l2_prefetch, moe  # noqa: E402
from gptoss.kernels.moe import Tiles  # noqa: E402
from gptoss.kernels.moe_routing import Routing  # noqa: E402
from gptoss.sampling import SamplingParams  # noqa: E402
from tests.gptoss.kernels.conftest import count_calls, record_flag, sass_json  # noqa: E402
from tests.gptoss.kernels.moekit import ALPHA, DEV, LIMIT, gpu, make_moe  # noqa: E402
from tests.gptoss.kernels.test_kernel_engine import make_engine, prompts_of  # noqa: E402


@pytest.mark.parametrize(
    ("v", "want"),
    [
        (None, set()),
        ("", set()),
        ("0", set()),
        ("all", {"moe", "o", "qkv", "kv"}),
        ("o, qkv", {"o", "qkv"}),
        ("kv", {"kv"}),
    ],
)
def test_the_switch_reads_parts(v, want):
    assert l2_prefetch.parse_parts(v) == want


def test_the_switch_refuses_unknown_parts_by_name():
    with pytest.raises(
        ValueError, match=r"GPTOSS_L2_PREFETCH='moe,lm_head': a comma list of moe, o, qkv, kv"
    ):
        l2_prefetch.parse_parts("moe,lm_head")


@triton.jit
def _chunks_kernel(lo_ptr, size_ptr, nbytes, NT: tl.constexpr):
    lo, size = l2_prefetch.chunks(nbytes, tl.program_id(0), tl.num_programs(0), NT)
    i = tl.program_id(0) * NT + tl.arange(0, NT)
    tl.store(lo_ptr + i, lo)
    tl.store(size_ptr + i, size)


@pytest.mark.parametrize(
    ("nbytes", "parts", "nt"),
    [
        (16, 1, 32),  # one chunk, the rest empty
        (4096, 7, 32),  # parts that do not divide it
        (4_147_200, 90, 128),  # 120b's W2 of one expert over gate_up's 90 programs
        (23_592_960, 132, 32),  # the O weight, one program an SM
        (1_441_792 + 48, 132, 32),  # a tail of 3 x 16 bytes
    ],
)
def test_chunks_tile_the_bytes_exactly_and_aligned(nbytes, parts, nt):
    lo = torch.full((parts * nt,), -1, dtype=torch.int64, device=DEV)
    size = torch.full((parts * nt,), -1, dtype=torch.int32, device=DEV)
    _chunks_kernel[(parts,)](lo, size, nbytes, NT=nt)
    spans = sorted((a, a + b) for a, b in zip(lo.tolist(), size.tolist(), strict=True) if b > 0)
    assert min(size.tolist()) == 0 or len(spans) == parts * nt  # sizes never negative
    assert all(a % 16 == 0 and (b - a) % 16 == 0 for a, b in spans)
    assert spans[0][0] == 0 and spans[-1][1] == nbytes
    assert all(spans[j][1] == spans[j + 1][0] for j in range(len(spans) - 1))  # no gap, no overlap


def test_the_sm90a_code_releases_first_prefetches_then_waits_and_keeps_the_k_loop():
    """Compiled for sm_90a on CPU by bench/kernels/prefetch_sass.py (a process without the
    interpreter): the standalone kernel's PREEXIT, UBLKPF, ACQBULK in that order; gate_up with PF has
    its 4 bulk prefetches (own W13 words and scales, a share of W2's words and scales), none in the
    K loop, whose length stays within 2 instructions of the kernel without PF."""
    got = sass_json("prefetch_sass.py")
    assert got["standalone"]["order"] == ["PREEXIT", "UBLKPF", "ACQBULK"]
    assert got["gate_up"]["ublkpf"] == 0
    assert got["gate_up_pf"]["ublkpf"] == 4 and got["gate_up_pf"]["ublkpf_in_loop"] == 0
    assert abs(got["gate_up_pf"]["k_loop"] - got["gate_up"]["k_loop"]) <= 2
    # decode attention with "kv": a line prefetch a key and tensor (K, V) a thread of its 2 warps,
    # all before the wait; none without
    from gptoss.kernels.attention import DECODE_CFG

    assert got["attn_kv"]["pf_before_wait"] == 2 * l2_prefetch.ATTN_KEYS // (32 * DECODE_CFG[1])
    assert got["attn_kv"]["pf_after_wait"] == 0 and got["attn_kv"]["release_after_wait"]
    assert got["attn"]["pf_before_wait"] == got["attn"]["pf_after_wait"] == 0


def test_prefetch_l2_is_a_no_op_where_it_cannot_run():
    """CPU tensors (and the interpreter) launch nothing; a misaligned view is refused where it runs."""
    t = torch.zeros(64, dtype=torch.bfloat16)
    l2_prefetch.prefetch_l2(t)  # returns: no kernel, no error
    assert not l2_prefetch.supported(t)


@gpu
def test_prefetch_l2_refuses_a_misaligned_view_on_gpu():
    t = torch.zeros(64, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="prefetch_l2 needs a contiguous, 16-byte aligned tensor"):
        l2_prefetch.prefetch_l2(t[1:])


@gpu
def test_gate_up_with_the_prefetch_gives_the_same_bits_on_gpu():
    """120b's decode step (one token, routing in the kernel, 128 experts, bf16): act, ids and counts
    equal with and without the prefetch of the tile and the down's weights."""
    ref, w = make_moe(128, 2880, 2880, 4, torch.bfloat16, seed=5, kernels="v3")
    x = torch.randn(1, 2880, device=DEV, generator=torch.Generator(DEV).manual_seed(1)).bfloat16()
    logits = F.linear(x.float(), ref.router_weight.float(), ref.router_bias.float()).contiguous()
    got = []
    for pf in (False, True):
        r = Routing.empty(1, 4, 128, DEV)
        act = moe.gate_up_v3(x, r, w, ALPHA, LIMIT, Tiles(16, 32, 128, 4, 4), logits=logits, prefetch_down=pf)
        got.append((act, r.ids.clone(), r.counts.clone()))
    assert all(torch.equal(a, b) for a, b in zip(got[0], got[1], strict=True))
    assert moe.moe_v3._prefetch_args(x, w, Tiles(16, 32, 128, 4, 4))["PF"]


def test_the_engine_with_every_prefetch_gives_the_reference_tokens(kernel_checkpoint, monkeypatch):
    """GPTOSS_L2_PREFETCH=all on one v3 copy: decode steps launch the O prefetch beside attention
    (every layer) and the next layer's QKV beside the down (every layer but the last), ask attention
    for its K/V prefetch (every layer), and one-token steps ask gate_up for the MoE's; prefill steps
    none. Tokens equal the torch reference's."""
    from gptoss import kernel_model
    from gptoss.kernels import attention, moe_layout, moe_v3_dec_gu

    monkeypatch.setattr(moe_layout, "KERNELS", "v3")
    monkeypatch.setattr(l2_prefetch, "ON", frozenset(l2_prefetch.PARTS))
    # 2-token steps on v3's gate_up (by default they take the split-K one, which never prefetches),
    # so that its prefetch_down is seen off there and on at one token
    monkeypatch.setattr(moe_v3_dec_gu, "TOKENS", frozenset({1}))
    pf_down = record_flag(monkeypatch, moe, "gate_up_v3", "prefetch_down")
    pf_kv = record_flag(monkeypatch, kernel_model, "paged_attention", "prefetch_kv")
    calls = count_calls(
        monkeypatch, [(attention, "prefetch_l2", "o"), (kernel_model.l2_prefetch, "prefetch_l2", "qkv")]
    )
    eng = make_engine(kernel_checkpoint, "triton", cuda_graphs=False)
    ref = make_engine(kernel_checkpoint, "torch")
    layers = len(eng.runner.kernel_runner.model.layers)
    calls.update(dict.fromkeys(calls, 0))
    pf_down.clear()
    pf_kv.clear()
    # two prompts: a prefill step, then 4 decode steps of 2 tokens (multi-step decode keeps both)
    prompts = prompts_of([3, 21], seed=11)
    params = [SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True) for n in (5, 3)]
    assert eng.generate(prompts, params) == ref.generate(prompts, params)
    assert calls == {"o": 4 * layers, "qkv": 4 * (layers - 1)}
    assert pf_down == [False] * 5 * layers  # no step of one token
    assert pf_kv == [False] * layers + [True] * 4 * layers
    # one prompt: a prefill step, then 3 decode steps of 1 token, whose gate_up prefetches
    pf_down.clear()
    pf_kv.clear()
    prompts, params = prompts[:1], [SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)]
    assert eng.generate(prompts, params) == ref.generate(prompts, params)
    assert pf_down == [False] * layers + [True] * 3 * layers
    assert pf_kv == [False] * layers + [True] * 3 * layers
    assert calls == {"o": 7 * layers, "qkv": 7 * (layers - 1)}

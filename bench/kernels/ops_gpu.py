"""GPU timings of the small fused ops (RMSNorm, RoPE + KV write, sampling) next to torch and vLLM.

    python bench/kernels/ops_gpu.py            (CUDA only; gpt-oss shapes, bf16)

Each row: kernel, case, ours_us, vllm_us (vLLM's own op where it has one and `vllm` imports,
else None), torch_us (eager torch), peer (which one `ratio` uses: vllm if timed, else torch),
ratio = ours_us / peer_us (< 1: ours is faster), hbm_frac = bytes moved / ours / a copy's bandwidth
(hbm.py, as the MoE and attention parts divide). Times are CUDA-graph replays (timing.py: GPU time,
no host launch cost; an op that cannot be captured is timed eagerly by do_bench, flagged on stderr
and listed after kernels_gpu.py's table), in microseconds per call.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import ModuleType

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from hbm import share  # noqa: E402
from timing import peer_failed, timed_us  # noqa: E402

from gptoss.config import PRESETS
from gptoss.kernels import sampling, sampling_draw
from gptoss.kernels.rmsnorm import fused_add_rms_norm
from gptoss.kernels.rope import build_cos_sin, rope_qkv
from gptoss.kernels.sampling import sample
from gptoss.kernels.sampling_draw import gumbel_argmax
from gptoss.kernels.sampling_filter import filter_cut, mask_top_k_top_p
from gptoss.kernels.sampling_top_p import top_p_cut
from gptoss.model import Rope, apply_rope, rms_norm

CFG = PRESETS["20b"]
H, HQ, HKV, D = CFG.hidden_size, CFG.num_attention_heads, CFG.num_key_value_heads, CFG.head_dim
V = CFG.vocab_size


def _vllm_ops():
    try:
        from vllm import _custom_ops
    except ImportError as e:  # vLLM is an optional peer: counted, the table lists it
        peer_failed("vllm peer unavailable", e)
        return None
    return _custom_ops


def _peer_us(fn: Callable[[], object] | None, what: str) -> float | None:
    if fn is None:
        return None
    try:
        return timed_us(fn, f"{what} peer")
    except (AttributeError, RuntimeError, TypeError) as e:  # a peer whose API moved is counted
        peer_failed(f"{what} peer", e)
        return None


def _row(
    kernel: str, case: str, ours: float, vllm: float | None, torch_us: float | None, nbytes: int
) -> dict:
    peer, peer_us = ("vllm", vllm) if vllm is not None else ("torch", torch_us)
    return {
        "kernel": kernel,
        "case": case,
        "ours_us": round(ours, 2),
        "vllm_us": None if vllm is None else round(vllm, 2),
        "torch_us": None if torch_us is None else round(torch_us, 2),
        "peer": peer,
        "ratio": None if not peer_us else round(ours / peer_us, 3),
        "hbm_frac": round(share(nbytes, ours), 3),
    }


def _torch_add_norm(x, res, w):
    return rms_norm(res + x, w, 1e-5)


def rmsnorm_case(T: int, vops) -> dict:
    w = 1 + 0.1 * torch.randn(H, device="cuda")
    x = torch.randn(T, H, device="cuda").bfloat16()
    res = torch.randn(T, H, device="cuda").bfloat16()
    ours = timed_us(partial(fused_add_rms_norm, x, res, w, 1e-5), f"rmsnorm T={T}")
    vl = None
    if vops is not None:  # vLLM's op is in place, with a bf16 weight
        vl = _peer_us(partial(vops.fused_add_rms_norm, x.clone(), res.clone(), w.bfloat16(), 1e-5), "rmsnorm")
    return _row(
        "rmsnorm",
        f"T={T} H={H} bf16 +residual",
        ours,
        vl,
        timed_us(partial(_torch_add_norm, x, res, w), f"rmsnorm T={T} torch"),
        4 * T * H * 2 + 4 * H,
    )


def rope_case(T: int, vops) -> dict:
    rope = Rope(CFG).cuda()
    cos_sin = build_cos_sin(rope, 131072)  # [P, D] float32
    block_size, n_blocks = 16, 8192
    k_cache = torch.zeros(n_blocks, block_size, HKV, D, device="cuda").bfloat16()
    v_cache = torch.zeros_like(k_cache)
    qkv = torch.randn(T, (HQ + 2 * HKV) * D, device="cuda").bfloat16()
    positions = torch.randint(0, 131072, (T,), device="cuda")
    slots = torch.randperm(n_blocks * block_size, device="cuda")[:T]

    def torch_fn():
        q, k, v = qkv.split([HQ * D, HKV * D, HKV * D], dim=1)
        cs = cos_sin[positions]  # [T, D]
        cos, sin = cs[:, : D // 2], cs[:, D // 2 :]
        q, k = apply_rope(q.view(T, HQ, D), cos, sin), apply_rope(k.view(T, HKV, D), cos, sin)
        k_cache.view(-1, HKV, D)[slots] = k
        v_cache.view(-1, HKV, D)[slots] = v.view(T, HKV, D)
        return q, k, v

    vl = None
    if vops is not None:
        cs_bf16, one = cos_sin.bfloat16(), torch.ones((), device="cuda")

        def vllm_fn():  # in place on views of qkv, then the cache write: two launches
            q, k, v = qkv.split([HQ * D, HKV * D, HKV * D], dim=1)
            vops.rotary_embedding(positions, q, k, D, cs_bf16, True)
            vops.reshape_and_cache_flash(
                k.view(T, HKV, D), v.view(T, HKV, D), k_cache, v_cache, slots, "auto", one, one
            )

        vl = _peer_us(vllm_fn, "rope")
    ours = timed_us(
        partial(rope_qkv, qkv, positions, cos_sin, HQ, HKV, D, k_cache, v_cache, slots), f"rope T={T}"
    )
    nbytes = T * ((HQ + 2 * HKV) * D * 2 * 2 + 2 * HKV * D * 2 + D * 4 + 16)
    return _row("rope_qkv", f"T={T} +kv write", ours, vl, timed_us(torch_fn, f"rope T={T} torch"), nbytes)


def switched(fn: Callable[[], object], module: ModuleType, **values: object) -> Callable[[], object]:
    """fn with module's switches at values while it runs (a capture records that path's launches)."""

    def run():
        old = {name: getattr(module, name) for name in values}
        for name, value in values.items():
            setattr(module, name, value)
        try:
            return fn()
        finally:
            for name, value in old.items():
                setattr(module, name, value)

    return run


def _masked(fn: Callable[[], object]) -> Callable[[], object]:
    """fn with sampling.USE_CUT off: the masked copy."""
    return switched(fn, sampling, USE_CUT=False)


def sample_cases(B: int, device: str = "cuda", vocab: int = V) -> list[dict]:
    """The sampling rows at batch B (device and vocab: a CPU test runs every case small)."""
    logits = torch.randn(B, vocab, device=device) * 3
    no_k = torch.zeros(B, dtype=torch.int32, device=device)
    ones, zeros = torch.ones(B, device=device), torch.zeros(B, device=device)
    seeds, offsets = torch.arange(B, device=device), torch.full((B,), 1000, device=device)
    nbytes = B * vocab * 4

    def torch_multinomial():
        return torch.multinomial(torch.softmax(logits / ones[:, None], -1), 1)

    def vllm_style():  # vLLM's random_sample without FlashInfer: probs / Exp(1) noise, argmax
        probs = torch.softmax(logits / ones[:, None], -1)
        return probs.div_(torch.empty_like(probs).exponential_()).argmax(-1)

    greedy = timed_us(
        partial(sample, logits, zeros, no_k, ones, seeds, offsets, filtered=False), f"B={B} greedy"
    )
    drawn = timed_us(partial(sample, logits, ones, no_k, ones, seeds, offsets, filtered=False), f"B={B} T=1")
    top_k = torch.full((B,), 50, dtype=torch.int32, device=device)
    top_p = torch.full((B,), 0.9, device=device)
    # top_k 50 on the engine's path (mask_within_top_k, k_cap from sampling.top_k_cap), its peer the
    # vocabulary sort every filtered batch took before (and a top-p-only batch still takes)
    filt = timed_us(
        _masked(partial(sample, logits, ones, top_k, top_p, seeds, offsets, filtered=True, k_cap=50)),
        f"B={B} top-k/p",
    )
    filt_sort = timed_us(
        partial(sample, logits, ones, top_k, top_p, seeds, offsets, filtered=True), f"B={B} top-k/p sort"
    )
    # the cut (sampling.USE_CUT, on by default since v66): sample()'s path with it on
    filt_cut = timed_us(
        lambda: gumbel_argmax(logits, ones, seeds, offsets, filter_cut(logits, ones, top_k, top_p, 50)),
        f"B={B} top-k/p cut",
    )
    top_p_only = timed_us(
        partial(sample, logits, ones, no_k, top_p, seeds, offsets, filtered=True), f"B={B} top-p"
    )
    # top_p alone by sampling_top_p's search (sampling_filter.TOP_P_SEARCH, on since v66) with the
    # masked copy (USE_CUT off), and with the draw applying the cut (the default)
    top_p_search = timed_us(
        _masked(partial(sample, logits, ones, no_k, top_p, seeds, offsets, filtered=True, top_p_search=True)),
        f"B={B} top-p search",
    )

    def search_cut():
        return gumbel_argmax(logits, ones, seeds, offsets, top_p_cut(logits, ones, top_p))

    top_p_search_cut = timed_us(search_cut, f"B={B} top-p search cut")
    # the engine's unfiltered draw on lm_head's bf16 logits, against what it did before: a float32 copy,
    # then the draw (the same ids)
    half = logits.bfloat16()
    drawn_bf16 = timed_us(
        partial(sample, half, ones, no_k, ones, seeds, offsets, filtered=False), f"B={B} T=1 bf16"
    )
    widened = timed_us(
        lambda: sample(half.float(), ones, no_k, ones, seeds, offsets, filtered=False),
        f"B={B} T=1 bf16 widened",
    )
    # the screened draw (sampling_draw.SCREEN: 1 within a chunk, the default from SCREEN_FROM rows; 2
    # shared by a row's chunks), each mode at every B, against the unscreened draw (the same ids)
    unfiltered = partial(sample, logits, ones, no_k, ones, seeds, offsets, filtered=False)
    unscreened = timed_us(switched(unfiltered, sampling_draw, SCREEN=0), f"B={B} T=1 screen 0")
    screened = [
        timed_us(switched(unfiltered, sampling_draw, SCREEN=m, SCREEN_FROM=1), f"B={B} T=1 screen {m}")
        for m in (1, 2)
    ]
    cut_unscreened = timed_us(
        switched(search_cut, sampling_draw, SCREEN=0), f"B={B} top-p search cut screen 0"
    )
    cut_screened = timed_us(
        switched(search_cut, sampling_draw, SCREEN=2, SCREEN_FROM=1), f"B={B} top-p search cut screen 2"
    )
    # the sort in one call over B rows, as before sampling.SORT_ROWS blocks (the row above's peer)
    one_sort = timed_us(
        lambda: gumbel_argmax(mask_top_k_top_p(logits, ones, no_k, top_p), ones, seeds, offsets),
        f"B={B} top-p one sort",
    )
    # a batch with B // 16 top-p rows: the engine's subset (sample's rows=) against filtering every row
    few_p = torch.where(torch.arange(B, device=device) % 16 == 0, top_p, 1.0)
    few_rows = torch.arange(0, B, 16, device=device)
    few = timed_us(
        partial(sample, logits, ones, no_k, few_p, seeds, offsets, filtered=True, rows=few_rows),
        f"B={B} 1/16 top-p rows",
    )
    few_all = timed_us(
        partial(sample, logits, ones, no_k, few_p, seeds, offsets, filtered=True),
        f"B={B} 1/16 top-p, all rows",
    )
    return [
        _row(
            "sample",
            f"B={B} greedy",
            greedy,
            None,
            timed_us(partial(torch.argmax, logits, -1), f"B={B} argmax"),
            nbytes,
        ),
        _row(
            "sample",
            f"B={B} T=1",
            drawn,
            timed_us(vllm_style, f"B={B} vllm-style"),
            timed_us(torch_multinomial, f"B={B} multinomial"),
            nbytes,
        ),
        _row("sample", f"B={B} T=1 bf16 logits", drawn_bf16, None, widened, nbytes // 2),
        _row("sample", f"B={B} T=1 screen 1", screened[0], None, unscreened, nbytes),
        _row("sample", f"B={B} T=1 screen 2", screened[1], None, unscreened, nbytes),
        _row("sample", f"B={B} T=1 top_k=50 top_p=0.9", filt, None, filt_sort, nbytes),
        _row("sample", f"B={B} T=1 top_k=50 top_p=0.9 cut", filt_cut, None, filt, nbytes),
        _row("sample", f"B={B} T=1 top_p=0.9", top_p_only, None, None, nbytes),
        _row("sample", f"B={B} T=1 top_p=0.9 search", top_p_search, None, top_p_only, nbytes),
        _row("sample", f"B={B} T=1 top_p=0.9 search cut", top_p_search_cut, None, top_p_only, nbytes),
        _row(
            "sample", f"B={B} T=1 top_p=0.9 search cut screen 2", cut_screened, None, cut_unscreened, nbytes
        ),
        _row("sample", f"B={B} T=1 top_p=0.9 sort blocks", top_p_only, None, one_sort, nbytes),
        _row("sample", f"B={B} T=1 top_p=0.9 on 1/16 rows", few, None, few_all, nbytes),
    ]


def run(rows: list) -> None:
    """Append one dict per (kernel, case) to rows (see the module docstring for the keys)."""
    if not torch.cuda.is_available():
        raise RuntimeError("bench/kernels/ops_gpu.py needs a CUDA GPU")
    torch.manual_seed(0)
    vops = _vllm_ops()
    rows.extend(rmsnorm_case(T, vops) for T in (1, 64, 1024, 8192))
    rows.extend(rope_case(T, vops) for T in (1, 64, 8192))
    for B in (1, 64, 256, 1024):
        rows.extend(sample_cases(B))


def main() -> None:
    rows: list[dict] = []
    run(rows)
    print(f"device: {torch.cuda.get_device_name()}")
    cols = ["kernel", "case", "ours_us", "vllm_us", "torch_us", "peer", "ratio", "hbm_frac"]
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in cols]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=False)))
    for r in rows:
        print("  ".join(str(r[c]).ljust(w) for c, w in zip(cols, widths, strict=False)))


if __name__ == "__main__":
    main()

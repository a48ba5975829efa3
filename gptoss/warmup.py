"""A short synthetic workload run once at start-up, so Triton compiles every kernel specialization a
real run reaches before the first request, not inside it.

Why. Triton compiles a kernel again for each new specialization: its constexprs, and whether an
integer argument is 1 or a multiple of 16. The start-up path (the MoE at powers of two, the decode
graphs) sees only round token counts, so a first Offline run on a fresh machine compiled 9 more
kernels inside its timing: 14.8 s of 215.7 s at 120b on an H200 (bench/results v48). Here real
requests run through the real scheduler, in two phases:
1. a full budget's step, steps of odd token counts, prefill chunks beside decodes, two filtered
   requests (top-k, top-p), one unfiltered sampled one (MLPerf's temperature 1, top_p 1: its second
   token is drawn from lm_head's bf16 logits, beside greedy rows) (and one on each LoRA adapter);
2. rounds of S decodes beside a prefill chunk, then a decode burst of S + 1 rows. A mixed step's
   decodes attend in one eager launch whose split count (a constexpr, and an int Triton specializes
   at 1 and at multiples of 16) follows S: round_sizes takes the first S of each. A burst of an odd
   row count leaves every other step's output row off 16-byte alignment, which the greedy tail
   specializes on: rounds of S = 2 and 16 (past its fused argmax's 16 rows) make those.
On an H200 (20b, 1000 x (1024 -> 1024), a cold Triton cache) the first phase alone took the
specializations inside the timing from 9 to 5: 3 of those eager decode launches and 2 of that tail.
Then the engine is as it was: no request left, every KV block free, request numbering from 0 again,
the host-time and preemption counters cleared, so what follows is what a fresh engine would do.
"""

from __future__ import annotations

import itertools
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gptoss.kernel_warm import attention_warm_sizes
from gptoss.sampling import SamplingParams

if TYPE_CHECKING:
    from gptoss.engine import LLMEngine

# Short prompts, decoding beside the long prompts' last chunk (more than attention's SMALL_DECODE
# of them: the mixed step takes the large-batch decode path, as Offline's do), long enough for a
# decode burst once the long prompts are done.
SHORT_LENS = (17, 33, 5) + (3,) * 61
SHORT_OUT = 6
GREEDY = SamplingParams(max_new_tokens=SHORT_OUT, temperature=0.0, ignore_eos=True)
# One token each: they sample at their prefill's end (filtered), and are gone before the decode
# bursts, which then take the greedy path they warm (a filtered request would join them and draw each
# step). Drawn in one step, a top-k row beside a top-p-only one compiles both filters: filter_cut at
# the top_k and top_p_cut's search (sampling_filter.filter_plan).
SAMPLED = SamplingParams(max_new_tokens=1, temperature=0.8, top_p=0.9, top_k=20, seed=1, ignore_eos=True)
SAMPLED_P = SamplingParams(max_new_tokens=1, temperature=0.8, top_p=0.9, seed=2, ignore_eos=True)
# Two tokens: the second is drawn in the next step, with no filtered row beside it, so from the bf16
# logits (KernelRunner._draw_logits); gone before the bursts too.
SAMPLED_T1 = SamplingParams(max_new_tokens=2, temperature=1.0, seed=3, ignore_eos=True)
ROUND_PROMPT = 3  # the second phase's short prompts
ROUND_LONG = 37  # and the prefill beside their decodes
LONG = SamplingParams(max_new_tokens=2, temperature=0.0, ignore_eos=True)


@dataclass(frozen=True, slots=True)
class WarmupStats:
    seconds: float
    step_tokens: tuple[int, ...]  # each step's token count, in order
    mixed_decodes: tuple[int, ...]  # the decodes of each step that also held prefill chunks
    burst_rows: tuple[int, ...]  # the rows of each multi-step decode burst


def warmup_prompts(
    budget: int, max_model_len: int, max_num_seqs: int, vocab_size: int
) -> list[tuple[list[int], SamplingParams]]:
    """The requests: the short ones first (they decode while the long ones still prefill), then long
    prompts (max_model_len - 9 or budget + 37 tokens, whichever is shorter) until more than a budget
    and 37 tokens wait, so one step runs the whole budget and the next mixes decodes with the rest.
    At most max_num_seqs requests."""
    rng = random.Random(0)

    def ids(n: int) -> list[int]:
        return [rng.randrange(vocab_size) for _ in range(n)]

    out: list[tuple[list[int], SamplingParams]] = []
    for i, n in enumerate(SHORT_LENS[: max_num_seqs - 1]):
        n = max(1, min(n, max_model_len - SHORT_OUT - 1))
        out.append((ids(n), {1: SAMPLED, 2: SAMPLED_P, 3: SAMPLED_T1}.get(i, GREEDY)))
    long_len = max(1, min(max_model_len - 9, budget + 37))
    total = sum(len(p) for p, _ in out)
    while total <= budget + 37 and len(out) < max_num_seqs:
        out.append((ids(long_len), LONG))
        total += long_len
    return out


def round_sizes(engine: LLMEngine) -> list[int]:
    """The second phase's S (module docstring), each with S + 1 <= max_num_seqs; none without the
    triton kernels (nothing compiles)."""
    kr, top = engine.runner.kernel_runner, engine.config.max_num_seqs - 1
    if kr is None:
        return []
    return sorted({*attention_warm_sizes(kr.model, top), *(s for s in (2, 16) if s <= top)})


def warm_up(engine: LLMEngine, sizes: list[int] | None = None) -> WarmupStats:
    """Run the two phases (module docstring) through `engine`, the second at `sizes` (default
    round_sizes), then reset what a run would see of it."""
    cfg = engine.config
    sched = engine.scheduler
    batches = []
    bursts: list[int] = []

    def schedule():  # observed for the stats, on this instance only for the warm-up
        batch = type(sched).schedule(sched)
        batches.append(batch)
        return batch

    def step() -> None:
        rows = [len(d.token_ids) for _, d in engine.step()]
        if max(rows, default=1) > 1:
            bursts.append(len(rows))

    adapters: list[str | None] = [None]
    if engine.runner.lora is not None:
        adapters += [a.name for a in engine.runner.lora.adapters]
    rng = random.Random(1)
    t0 = time.perf_counter()
    sched.schedule = schedule
    try:
        prompts = warmup_prompts(
            cfg.max_num_batched_tokens, engine.max_model_len, cfg.max_num_seqs, engine.vocab_size
        )
        for i, (prompt, params) in enumerate(prompts):
            engine.add(f"warmup-{i}", prompt, params, adapters[i % len(adapters)])
        while engine.has_work():
            step()
        short = max(1, min(ROUND_PROMPT, engine.max_model_len - SHORT_OUT - 1))
        long = max(1, min(ROUND_LONG, engine.max_model_len - 3))
        for n in round_sizes(engine) if sizes is None else sizes:
            ids = [f"warmup-{n}-{i}" for i in range(n)]
            for rid in ids:
                engine.add(rid, [rng.randrange(engine.vocab_size) for _ in range(short)], GREEDY)
            while any(r in engine.seqs and len(engine.seqs[r].token_ids) == short for r in ids):  # prefills
                step()
            engine.add(f"warmup-{n}-long", [rng.randrange(engine.vocab_size) for _ in range(long)], LONG)
            while engine.has_work():
                step()
    finally:
        del sched.schedule
    runner = engine.runner
    if runner.device.type == "cuda":
        import torch

        torch.cuda.synchronize(runner.device)
    engine._ids = itertools.count()
    sched.num_preemptions = 0
    if runner.kernel_runner is not None:
        runner.kernel_runner.host_times.clear()
    steps = [b for b in batches if b]
    return WarmupStats(
        time.perf_counter() - t0,
        tuple(b.num_tokens for b in steps),
        tuple(b.num_new.count(1) for b in steps if 1 in b.num_new and any(n > 1 for n in b.num_new)),
        tuple(bursts),
    )

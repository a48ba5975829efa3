"""Where a decode step's time goes on the GPU, and how far our logits are from the reference.

    python bench/profile_gpu.py --model-path CKPT [--batch 1 --batch 64] [--steps 20] [--diag]
        [--lora ADAPTER]    # the --batch requests through a PEFT adapter
        [--prompt-len 1536] # their context (an Offline 1024 -> 1024 decode step: --batch 1000)
    python bench/profile_gpu.py --model-path CKPT --batch 0 --prefill 64x1024 [--max-num-batched-tokens 16384]
        [--decoding 512]    # the prefill steps beside 512 decoding sequences (an Offline run's mixed steps)

profile: B requests of --prompt-len (128) tokens are prefilled, then `--steps` decode steps run under
torch.profiler. Printed per batch size: wall ms per step (CUDA events), host ms per step (before the
step's one synchronisation), and each kernel's GPU µs per step and share, largest first, with what
it adds to the stream's span ("added", `chain`) and the idle time between kernels. With PDL on
(GPTOSS_PDL unset) a kernel's own time includes its wait for the one before; "added" does not, so
it ranks the kernels as the step runs them back to back.
prefill: N prompts of L tokens are added at once and the steps that prefill them all (each up to
--max-num-batched-tokens) run under torch.profiler: wall ms and prefill tokens/s, kernels as above.
ncu: the same decode steps without torch.profiler, inside CUDA's profiler range, so Nsight Compute
(`ncu --profile-from-start off`) reads the counters of exactly their kernels (bench/moe_ncu_gpu.sh).
diag: one prefill forward of 4 prompts x 64 tokens through (a) our kernels in bf16, (b) the torch
reference in bf16, (c) the torch reference in float32; prints rel L2 error of (a) and (b) against (c)
and top-1 agreement, so kernel error can be told apart from bf16 noise of a random-weight model.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gptoss.engine import EngineConfig, LLMEngine  # noqa: E402
from gptoss.sampling import SamplingParams  # noqa: E402


def chain(spans: list[tuple[float, float, str]]) -> tuple[dict[str, float], float]:
    """What each kernel adds to the stream's span: spans are (start, end, name) in µs. Taken in
    order of start, a kernel adds the part of it that ends past every kernel before it (its end
    less max(its start, the latest end so far)); the time when no kernel ran is the idle gap.
    The added times and the gap sum to the span. With PDL a kernel starts while the one before it
    runs and waits inside (griddepcontrol.wait), so its own duration counts that wait; what it
    adds is its cost in the chain as the step runs it. -> (name -> added µs, idle µs)."""
    added: dict[str, float] = defaultdict(float)
    idle = 0.0
    frontier: float | None = None
    for start, end, name in sorted(spans):
        if frontier is None:
            frontier = start
        idle += max(0.0, start - frontier)
        added[name] += max(0.0, end - max(start, frontier))
        frontier = max(frontier, end)
    return dict(added), idle


def _kernel_times(prof) -> tuple[dict[str, list[float]], float]:
    """Kernel name (first 60 characters) -> [GPU µs, calls, µs added to the chain (`chain`)] over the
    profiled steps, and the idle µs between kernels."""
    per: dict[str, list[float]] = defaultdict(lambda: [0.0, 0, 0.0])
    spans = []
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            p = per[ev.name[:60]]
            p[0] += ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
            p[1] += 1
            spans.append((ev.time_range.start, ev.time_range.end, ev.name[:60]))
    added, idle = chain(spans)
    for name, us in added.items():
        per[name][2] = us
    return per, idle


def _print_kernels(
    per: dict[str, list[float]], steps: int, total: float, rows: int, ms: bool, idle: float
) -> None:
    """The `rows` largest kernels: time a step (µs, or ms with `ms`), calls a step, share, and the
    time each adds to the stream (`chain`: with PDL on, the ranking that matters), then the idle
    time between kernels a step."""
    unit, div, w = ("ms/step", 1000, 2) if ms else ("us/step", 1, 1)
    print(f"  {'kernel':60} {unit:>9} {'calls':>6} {'share':>6} {'added':>9}")
    for name, (us, n, added) in sorted(per.items(), key=lambda kv: -kv[1][0])[:rows]:
        print(
            f"  {name:60} {us / steps / div:9.{w}f} {n / steps:6.1f} {us / steps / total:6.1%} "
            f"{added / steps / div:9.{w}f}"
        )
    print(f"  {'idle between kernels':60} {idle / steps / div:9.{w}f}")


def _new_tokens(batch: int, prompt_len: int, steps: int, step_tokens: int) -> int:
    """Outputs of the profiled requests. The first prompts decode while the later ones prefill (a step
    takes step_tokens): their outputs must outlast that, or the profiled steps run part of the batch."""
    return steps + 8 + -(-batch * prompt_len // step_tokens) + 2


def ncu_kv_tokens(batches: list[int], args: argparse.Namespace, max_model_len: int) -> int:
    """The KV cache an ncu run needs: the profiled sequences' prompts and steps, and room for one
    sequence of max_model_len (the engine's check), each with its sliding window and a block spare."""
    rows = max(batches)
    per_seq = args.prompt_len + _new_tokens(rows, args.prompt_len, args.steps, args.max_num_batched_tokens)
    return max(rows * per_seq, max_model_len) + rows * (128 + 16)


def profile(
    eng: LLMEngine, batch: int, steps: int, lora: str | None = None, prompt_len: int = 128, ncu: bool = False
) -> None:
    rng = random.Random(batch)
    new_tokens = _new_tokens(batch, prompt_len, steps, eng.config.max_num_batched_tokens)
    sp = SamplingParams(max_new_tokens=new_tokens, temperature=0, ignore_eos=True)
    for i in range(batch):
        eng.add(f"p{batch}-{i}", [rng.randrange(200_000) for _ in range(prompt_len)], sp, lora)
    while any(s.num_computed < s.num_prompt_tokens for s in eng.seqs.values()):
        eng.step()
    for _ in range(3):
        eng.step()
    runner = eng.runner.kernel_runner
    rows = len(eng.seqs)
    if rows != batch:
        print(f"warning: {rows} of {batch} sequences still decoding when the profile starts")
    runner.host_times.clear()
    torch.cuda.synchronize()
    if ncu:  # Nsight Compute (--profile-from-start off) takes exactly these steps' kernels
        torch.cuda.profiler.start()
        for _ in range(steps):
            eng.step()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        print(f"batch {rows} at context {prompt_len}: {steps} decode steps inside ncu's capture range")
        while eng.has_work():
            eng.step()
        return
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        start.record()
        for _ in range(steps):
            eng.step()
        end.record()
        torch.cuda.synchronize()
    wall = start.elapsed_time(end) / steps
    host = runner.host_ms_per_step()
    per, idle = _kernel_times(prof)
    total = sum(v[0] for v in per.values()) / steps
    print(
        f"\nbatch {rows} at context {prompt_len}{' with LoRA' if lora else ''}: {wall:.3f} ms/step wall, "
        f"{host:.3f} ms host, "
        f"kernels {total / 1000:.3f} ms "
        f"({rows / wall * 1000:.0f} tok/s)"
    )
    _print_kernels(per, steps, total, 14, ms=False, idle=idle)
    while eng.has_work():
        eng.step()


def host_prefill(eng: LLMEngine, n: int, length: int) -> None:
    """The same prefill without torch.profiler, under cProfile: wall per step and the host's hot spots."""
    import cProfile
    import pstats

    rng = random.Random(n * length + 1)
    sp = SamplingParams(max_new_tokens=1, temperature=0, ignore_eos=True)
    for i in range(n):
        eng.add(f"h{n}x{length}-{i}", [rng.randrange(200_000) for _ in range(length)], sp)
    torch.cuda.synchronize()
    steps = 0
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    while any(s.num_computed < s.num_prompt_tokens for s in eng.seqs.values()):
        eng.step()
        steps += 1
    torch.cuda.synchronize()
    prof.disable()
    wall = time.perf_counter() - t0
    print(f"\nprefill {n}x{length} under cProfile: {steps} steps, {1000 * wall / steps:.1f} ms/step wall")
    pstats.Stats(prof).sort_stats("tottime").print_stats(22)
    while eng.has_work():
        eng.step()


def profile_prefill(eng: LLMEngine, n: int, length: int, decoding: int = 0) -> None:
    """With `decoding` > 0, that many sequences (1024-token prompts) decode alongside the prompts:
    the mixed steps of an Offline run, against the pure prefill steps without them."""
    rng = random.Random(n * length)
    sp = SamplingParams(max_new_tokens=1, temperature=0, ignore_eos=True)
    for i in range(2):  # warm-up: the same kernels and shapes, compiled before the timed steps
        eng.add(f"w{i}", [rng.randrange(200_000) for _ in range(length)], sp)
    while eng.has_work():
        eng.step()
    # no stop ids but not ignore_eos: an unknown length, so admission reserves nothing for them
    long = SamplingParams(max_new_tokens=1 << 20, temperature=0, stop_token_ids=())
    for i in range(decoding):
        eng.add(f"d{i}", [rng.randrange(200_000) for _ in range(1024)], long)
    while any(s.num_computed < s.num_prompt_tokens for s in eng.seqs.values()):
        eng.step()
    for i in range(n):
        eng.add(f"f{n}x{length}-{i}", [rng.randrange(200_000) for _ in range(length)], sp)
    torch.cuda.synchronize()
    steps = 0
    t0 = time.perf_counter()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        while any(s.num_computed < s.num_prompt_tokens for s in eng.seqs.values()):
            eng.step()
            steps += 1
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    per, idle = _kernel_times(prof)
    total = sum(v[0] for v in per.values()) / steps
    print(
        f"\nprefill {n}x{length} beside {decoding} decodes: {steps} steps, "
        f"{1000 * wall / steps:.1f} ms/step wall (profiler on), kernels {total / 1000:.1f} ms/step, "
        f"{n * length / wall:.0f} prefill tok/s"
    )
    _print_kernels(per, steps, total, 16, ms=True, idle=idle)
    for i in range(decoding):
        eng.abort(f"d{i}")
    while eng.has_work():
        eng.step()


def diag(path: Path) -> None:
    from gptoss.attention_ref import DenseAttention
    from gptoss.kernel_model import StepMeta
    from gptoss.model import GptOss

    rng = random.Random(5)
    prompts = [[rng.randrange(200_000) for _ in range(64)] for _ in range(4)]
    logits: dict[str, list[torch.Tensor]] = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        ref = GptOss.from_checkpoint(path, "cuda", dtype)
        logits[name] = [
            ref.compute_logits(
                ref(torch.tensor(p, device="cuda"), torch.arange(64, device="cuda"), DenseAttention())
            ).float()
            for p in prompts
        ]
        del ref
        gc.collect()
        torch.cuda.empty_cache()
    eng = LLMEngine(
        EngineConfig(
            model_path=path,
            device="cuda",
            max_num_seqs=4,
            kv_cache_tokens=4096,
            max_model_len=1024,
            kernels="triton",
            cuda_graphs=False,
        )
    )
    km = eng.runner.kernel_runner.model
    i32 = dict(dtype=torch.int32, device="cuda")
    out = []
    for p in prompts:
        meta = StepMeta(
            query_start=torch.tensor([0, 64], **i32),
            context_lens=torch.zeros(1, **i32),
            full_table=torch.zeros(1, 64, **i32),
            ring_table=torch.zeros(1, km.ring_len, **i32),
            full_slots=torch.full((64,), -1, dtype=torch.int64, device="cuda"),
            ring_slots=torch.full((64,), -1, dtype=torch.int64, device="cuda"),
            max_query_len=64,
            num_decode=0,
        )
        out.append(
            km.logits(km.forward(torch.tensor(p, device="cuda"), torch.arange(64, device="cuda"), meta))
        )
    logits["triton"] = out

    def err(a: str) -> tuple[float, float]:
        x, y = torch.cat(logits[a]), torch.cat(logits["fp32"])
        return float((x - y).norm() / y.norm()), float((x.argmax(-1) == y.argmax(-1)).float().mean())

    for name in ("bf16", "triton"):
        e, agree = err(name)
        print(
            f"diag: {name:6} vs torch fp32: rel L2 {e:.3e}, top-1 agreement {agree:.1%} over"
            f" {4 * 64} positions"
        )
    x, y = torch.cat(logits["triton"]), torch.cat(logits["bf16"])
    print(
        f"diag: triton vs torch bf16: rel L2 {float((x - y).norm() / y.norm()):.3e}, "
        f"top-1 {float((x.argmax(-1) == y.argmax(-1)).float().mean()):.1%}"
    )
    top2 = torch.cat(logits["fp32"]).topk(2, -1).values
    gap = (top2[:, 0] - top2[:, 1]) / torch.cat(logits["fp32"]).std(-1)
    print(
        f"diag: fp32 top-1 margin in logit std units: median {gap.median():.3f}, "
        f"10th pct {gap.quantile(0.1):.3f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", type=Path, required=True)
    ap.add_argument("--batch", type=int, action="append", default=None)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--diag", action="store_true")
    ap.add_argument("--eager", action="store_true")
    ap.add_argument("--batch-invariant", action="store_true", help="the engine's --batch-invariant mode")
    ap.add_argument("--prefill", action="append", default=[], help="NxL: N prompts of L tokens")
    ap.add_argument("--max-num-batched-tokens", type=int, default=16384)
    ap.add_argument("--decoding", type=int, default=0, help="--prefill beside this many decoding sequences")
    ap.add_argument("--cprofile", action="store_true", help="--prefill again under cProfile (host hot spots)")
    ap.add_argument("--lora", default=None, help="a PEFT adapter: the --batch requests run through it")
    ap.add_argument(
        "--prompt-len", type=int, default=128, help="--batch requests' prompt tokens (their context)"
    )
    ap.add_argument(
        "--ncu",
        action="store_true",
        help="no torch.profiler: the --steps decode steps between cudaProfilerStart and Stop, for "
        "`ncu --profile-from-start off` (bench/moe_ncu_gpu.sh TARGET=step)",
    )
    args = ap.parse_args()
    if args.diag:
        diag(args.model_path)
    batches = args.batch or [1, 64]
    t = time.perf_counter()
    max_model_len = max(
        4096,
        *(
            args.prompt_len + _new_tokens(b, args.prompt_len, args.steps, args.max_num_batched_tokens)
            for b in batches
        ),
    )
    eng = LLMEngine(
        EngineConfig(
            model_path=args.model_path,
            device="cuda",
            max_num_seqs=max(256, args.decoding + 64, *(args.batch or [])),
            max_model_len=max_model_len,
            max_num_batched_tokens=args.max_num_batched_tokens,
            # Under ncu a small cache: its kernel replay saves and restores what a kernel may write, and a
            # GPU filled by a cache sized from free memory leaves it no room (v34: ncu's run of the 120b
            # step ended non-zero after 182 s with nothing in its log).
            kv_cache_tokens=ncu_kv_tokens(batches, args, max_model_len) if args.ncu else None,
            kernels="triton",
            cuda_graphs=not args.eager,
            decode_steps=1,  # one engine step = one decode step, so per-step figures divide cleanly
            batch_invariant=args.batch_invariant,
            lora=(f"lora={args.lora}",) if args.lora else (),
        )
    )
    print(f"engine up in {time.perf_counter() - t:.1f} s")
    for b in batches:
        if b > 0:
            profile(eng, b, args.steps, "lora" if args.lora else None, args.prompt_len, args.ncu)
    for spec in args.prefill:
        n, length = map(int, spec.split("x"))
        profile_prefill(eng, n, length, args.decoding)
        if args.cprofile:
            host_prefill(eng, n, length)


if __name__ == "__main__":
    main()

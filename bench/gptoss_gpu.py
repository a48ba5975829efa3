"""Our engine against vLLM 0.26.0 on one GPU, same checkpoint, same token-id prompts, one table.

    python bench/gptoss_gpu.py --model-path CKPT [--decode 128x512] [--throughput 1000x1024x1024 ...]
        [--vllm-script .wc1/bench_vllm.py] [--engine gptoss,vllm] [--out DIR]

Workloads (as vLLM's side, shared/tools/vllm_device/bench_vllm.py, runs them): random prompt ids,
greedy, ignore_eos, exactly OUT new tokens per request.
  start-up   process start to the first token of one request (our engine: load + graph capture)
  decode     batch 1, one prompt of IN tokens, OUT new tokens, best of 3, prefill included
  throughput N prompts at once (Offline), output tokens / wall seconds
Also printed for ours: host milliseconds per decode step (scheduling + metadata + launch, the time
the CPU spends before the step's one synchronisation) and the greedy agreement of the triton
kernels with the torch reference on 16 prompts x 32 tokens (--agreement).
Each engine runs in its own process, one after the other, so each gets the whole GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
T_PROCESS = time.perf_counter()


def rand_prompts(n: int, length: int, seed: int, vocab: int = 200_000) -> list[list[int]]:
    rng = random.Random(seed)  # the same ids bench_vllm.py draws for the same (n, length, seed)
    return [[rng.randrange(vocab) for _ in range(length)] for _ in range(n)]


def emit(rows: list[dict], out: Path | None, record: dict) -> None:
    print("RESULT " + json.dumps(record), flush=True)
    rows.append(record)
    if out is not None:
        with open(out / "results.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")


def run_ours(args: argparse.Namespace, out: Path | None) -> list[dict]:
    sys.path.insert(0, str(REPO))
    import torch

    from bench.compile_watch import CompileWatch
    from gptoss.engine import EngineConfig, LLMEngine
    from gptoss.sampling import SamplingParams

    rows: list[dict] = []
    cfg = EngineConfig(
        model_path=Path(args.model_path),
        device="cuda",
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        kv_cache_tokens=args.kv_cache_tokens,
        kv_cache_dtype=args.kv_cache_dtype,
        kernels=args.kernels,
        cuda_graphs=not args.eager,
        batch_invariant=args.batch_invariant,
        warm_kernels=not args.no_warm_kernels,
        precompile=not args.no_precompile,
        # unset: the engine's own default, declared once in EngineConfig
        **({} if args.decode_steps is None else {"decode_steps": args.decode_steps}),
    )
    t = time.perf_counter()
    eng = LLMEngine(cfg)
    init = time.perf_counter() - t
    eng.generate([[1, 2, 3]], SamplingParams(max_new_tokens=1, temperature=0, ignore_eos=True))
    runner = eng.runner.kernel_runner
    moe = runner.model.layers[0].moe if runner is not None else None
    emit(
        rows,
        out,
        {
            "engine": "gptoss",
            "what": "startup",
            "engine_init_s": round(init, 1),
            "first_token_s": round(time.perf_counter() - T_PROCESS, 1),
            "kv_cache_tokens": eng.runner.kv_cache_tokens,
            "kv_cache_dtype": args.kv_cache_dtype,
            "warmup": eng.info()["warmup"],  # seconds and steps inside engine_init_s; None: off
            "precompile": eng.info()["precompile"],  # gptoss.precompile's counts and seconds; None: off
            "startup_s": eng.info()["startup_s"],  # each phase of engine_init_s (gptoss.startup_clock)
            # which expert layouts ran (an A/B row must say which side it is) and every switch set
            "moe_layouts": None
            if moe is None
            else "+".join(filter(None, (moe.layout, moe.large and moe.large.layout))),
            "switches": {k: v for k, v in sorted(os.environ.items()) if k.startswith("GPTOSS_")},
        },
    )

    def greedy(n: int) -> SamplingParams:
        return SamplingParams(max_new_tokens=n, temperature=0, ignore_eos=True)

    eng.generate(rand_prompts(4, 64, 123), greedy(16))  # warm-up, as vLLM's side does
    for spec in args.decode:
        lin, lout = (int(x) for x in spec.split("x"))
        prompts = rand_prompts(1, lin, seed=99)
        eng.generate(prompts, greedy(8))
        best = None
        with CompileWatch() as jit:
            for _ in range(3):
                if runner is not None:
                    runner.host_times.clear()
                torch.cuda.synchronize()
                t = time.perf_counter()
                outs = eng.generate(prompts, greedy(lout))
                dt = time.perf_counter() - t
                best = dt if best is None else min(best, dt)
        emit(
            rows,
            out,
            {
                "engine": "gptoss",
                "what": "batch1_decode",
                "input_len": lin,
                "output_len": len(outs[0]),
                "wall_s_best_of_3": round(best, 3),
                "tok_s_incl_prefill": round(len(outs[0]) / best, 1),
                # the first launch holds the prefill
                "host_ms_per_step": round(runner.host_ms_per_step(skip=1), 3) if runner is not None else 0.0,
                **jit.fields(),
            },
        )
    for spec in args.throughput:
        n, lin, lout = (int(x) for x in spec.split("x"))
        prompts = rand_prompts(n, lin, seed=lin * 7 + n)
        if runner is not None:
            runner.host_times.clear()
        phases = trace_steps(eng) if args.trace else None
        torch.cuda.synchronize()
        with CompileWatch() as jit:
            t = time.perf_counter()
            outs = eng.generate(prompts, greedy(lout))
            dt = time.perf_counter() - t
        if phases is not None:
            del eng.step, eng.scheduler.schedule  # back to the classes'
            print_phases(spec, phases)
        n_out = sum(map(len, outs))
        emit(
            rows,
            out,
            {
                "engine": "gptoss",
                "what": "offline_throughput",
                "num_prompts": n,
                "input_len": lin,
                "output_len": lout,
                "wall_s": round(dt, 2),
                "output_tok_s": round(n_out / dt, 1),
                "steps": sum(n for _, n in runner.host_times) if runner is not None else 0,
                "host_ms_per_step": round(runner.host_ms_per_step(), 3) if runner is not None else 0.0,
                **jit.fields(),
            },
        )
    return rows


def trace_steps(eng) -> dict[str, list[float]]:
    """Wrap eng.step (instance attribute) to sum wall seconds, steps, decode rows and prefill tokens
    by the kind of step: prefill only, mixed (decodes and prefill chunks), decode, multi-step decode."""
    phases: dict[str, list[float]] = {}
    schedule, step = eng.scheduler.schedule, eng.step
    last: list = []

    def sched():
        batch = schedule()
        last[:] = [batch]
        return batch

    def traced():
        t = time.perf_counter()
        out = step()
        dt = time.perf_counter() - t
        if last and last[0]:
            b = last[0]
            dec = sum(1 for m in b.num_new if m == 1)
            pre = sum(m for m in b.num_new if m != 1)
            multi = max((len(d.token_ids) for _, d in out), default=1) > 1
            kind = "multi-step decode" if multi else "decode" if not pre else "mixed" if dec else "prefill"
            acc = phases.setdefault(kind, [0.0, 0, 0, 0])
            acc[0] += dt
            acc[1] += 1
            acc[2] += dec
            acc[3] += pre
        return out

    eng.scheduler.schedule = sched
    eng.step = traced
    return phases


def print_phases(spec: str, phases: dict[str, list[float]]) -> None:
    print(f"steps of {spec} by kind: wall s, steps, ms/step, mean decode rows, prefill tokens")
    for kind, (sec, steps, dec, pre) in phases.items():
        print(f"  {kind:18} {sec:8.2f} s {steps:6d} {1000 * sec / steps:8.2f} {dec / steps:8.1f} {pre:9d}")


def run_agreement(args: argparse.Namespace, out: Path | None) -> list[dict]:
    """Greedy tokens of --kernels triton vs --kernels torch: 16 prompts x 32 tokens, in one process
    (two engines one after the other), and batch invariance of triton (alone vs in a batch). Each
    --fault checkpoint (bench/fault_checkpoint.py: a known-wrong model) runs triton too, scored
    against torch on --model-path: the rate a wrong model gets, which says what the others detect."""
    sys.path.insert(0, str(REPO))
    import gc

    import torch

    from bench.agreement import prefix_rate as rate
    from gptoss.engine import EngineConfig, LLMEngine
    from gptoss.sampling import SamplingParams

    rows: list[dict] = []
    prompts = rand_prompts(16, 64, seed=7)
    sp = SamplingParams(max_new_tokens=32, temperature=0, ignore_eos=True)
    got = {}
    runs = [("triton", "triton", False, args.model_path), ("bi", "triton", True, args.model_path)]
    runs += [(f"fault:{Path(f).name}", "triton", False, f) for f in args.fault]
    runs.append(("torch", "torch", False, args.model_path))
    for name, kernels, invariant, path in runs:
        eng = LLMEngine(
            EngineConfig(
                model_path=Path(path),
                device="cuda",
                max_num_seqs=64,
                max_model_len=4096,
                kv_cache_tokens=64 * 4096 // 4,
                kernels=kernels,
                batch_invariant=invariant,
            )
        )
        got[name] = eng.generate(prompts, sp)
        if name in ("triton", "bi"):
            got[name + "_alone"] = [eng.generate([p], sp)[0] for p in prompts]
        del eng
        gc.collect()
        torch.cuda.empty_cache()

    emit(
        rows,
        out,
        {
            "engine": "gptoss",
            "what": "greedy_agreement",
            "triton_vs_torch": round(rate(got["triton"], got["torch"]), 4),
            "batch_invariance": round(rate(got["triton_alone"], got["triton"]), 4),
            # --batch-invariant (gptoss.kernels.batch_invariant): the rate the issue asks for
            "batch_invariance_bi_mode": round(rate(got["bi_alone"], got["bi"]), 4),
            "bi_vs_default": round(rate(got["bi"], got["triton"]), 4),
            "exact_sequences": sum(x == y for x, y in zip(got["triton"], got["torch"], strict=False)),
        }
        | {
            f"{name}_vs_torch": round(rate(got[name], got["torch"]), 4)
            for name in got
            if name.startswith("fault:")
        },
    )
    return rows


def run_vllm(args: argparse.Namespace, out: Path | None) -> tuple[list[dict], int]:
    cmd = [
        sys.executable,
        args.vllm_script,
        "--model",
        args.model_path,
        "--max-model-len",
        str(args.max_model_len),
    ]
    for d in args.decode:
        cmd += ["--decode", d]
    for t in args.throughput:
        cmd += ["--throughput", t]
    env = dict(os.environ, VLLM_USE_FLASHINFER_SAMPLER="0")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    rows: list[dict] = []
    first_token = None
    log = open(out / "vllm.log", "w") if out is not None else None
    for line in proc.stdout:
        if log:
            log.write(line)
        if line.startswith("RESULT "):
            r = json.loads(line[7:])
            r["engine"] = "vllm"
            if r["what"] == "engine_init":
                first_token = time.perf_counter() - t0
                r = {
                    "engine": "vllm",
                    "what": "startup",
                    "engine_init_s": r["seconds"],
                    "first_token_s": round(first_token, 1),
                }
            emit(rows, out, r)
    proc.wait()
    if proc.returncode:
        print(f"vllm bench exited {proc.returncode}; see vllm.log", flush=True)
    return rows, proc.returncode


def main() -> None:
    from gpu_table import table  # beside this file: run as a script, bench/ is on the path

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--engine", default="gptoss,vllm", help="comma list of gptoss, vllm, agreement")
    ap.add_argument("--decode", action="append", default=None)
    ap.add_argument("--throughput", action="append", default=None)
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--max-num-seqs", type=int, default=1024)
    ap.add_argument("--max-num-batched-tokens", type=int, default=16384)
    ap.add_argument("--kernels", default="triton")
    ap.add_argument("--eager", action="store_true", help="no CUDA graphs for our engine")
    ap.add_argument("--kv-cache-tokens", type=int, default=None, help="our engine's KV cache size")
    ap.add_argument("--kv-cache-dtype", default="auto", help="our engine's KV cache elements: auto or fp8")
    ap.add_argument("--trace", action="store_true", help="our Offline runs' wall time by kind of step")
    ap.add_argument(
        "--no-warm-kernels",
        action="store_true",
        help="our engine without its start-up warm-up (gptoss.warmup)",
    )
    ap.add_argument(
        "--no-precompile",
        action="store_true",
        help="our engine without compiling its recorded specializations as it loads (gptoss.precompile)",
    )
    ap.add_argument("--batch-invariant", action="store_true", help="our engine with --batch-invariant")
    ap.add_argument(
        "--fault",
        action="append",
        default=[],
        help="agreement: also score this known-wrong checkpoint (bench/fault_checkpoint.py) against torch",
    )
    ap.add_argument(
        "--decode-steps",
        type=int,
        default=None,
        help="our engine's decode steps a burst (default: the engine's)",
    )
    ap.add_argument("--vllm-script", default=str(REPO / ".wc1" / "bench_vllm.py"))
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.decode = args.decode if args.decode is not None else ["128x512"]
    args.throughput = args.throughput if args.throughput is not None else []
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    if args.child:
        {"gptoss": run_ours, "agreement": run_agreement}[args.child](args, args.out)
        return
    rows: list[dict] = []
    failed: list[str] = []
    for engine in args.engine.split(","):
        if engine == "vllm":
            got, rc = run_vllm(args, args.out)
            rows += got
            if rc:
                failed.append(engine)
            continue
        # Each of ours in a fresh process too: the GPU memory and start-up are its own.
        cmd = [sys.executable, __file__, *sys.argv[1:], "--child", engine]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout.splitlines():
            if line.startswith("RESULT "):
                rows.append(json.loads(line[7:]))
            else:
                print(line)
        if proc.returncode:
            failed.append(engine)
            print(f"{engine} exited {proc.returncode}", flush=True)
    table(rows)
    if failed:  # the table holds what did run; the exit status says what did not
        print(f"failed: {', '.join(failed)}")
        sys.exit(1)


if __name__ == "__main__":
    main()

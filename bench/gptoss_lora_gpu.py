"""LoRA on the GPU: our engine with a random rank-16 adapter against itself without, and against
vLLM 0.26.0 with the same adapter; one table at the end (issue 13).

    python bench/gptoss_lora_gpu.py --model-path /tmp/ck20 --out DIR [--parts ours,vllm,mlperf]
        [--rank 16] [--delta 0.25] [--offline 1000x1024x1024] [--c16 1000x215x199] [--vllm-moe-backend auto]

The adapter (gptoss.make_lora: q/k/v/o_proj and both expert parameters, bf16) is written once to
DIR/lora-r16 (or --adapter; DIR/lora-r16-dX with --delta X, make_lora's strength). Parts, each engine
in its own process (the whole GPU, its own start):
  ours    gptoss Offline N x (IN -> OUT) without, then with the adapter (--offline); with the adapter
          at concurrency 16 (max_num_seqs 16, all prompts queued: a closed loop of 16, as the seed's
          `vllm bench serve --max-concurrency 16`; --c16); and greedy tokens of the mlperf part's
          16 prompts (stop ids on, 32 new tokens) for the agreement row
  vllm    vLLM LLM(enable_lora, max_lora_rank R, max_num_seqs 16).generate(the --c16 prompts,
          lora_request) (--vllm-moe-backend: vLLM's kernel_config.moe_backend, e.g. triton_unfused,
          the seed's path; auto lets vLLM choose: Marlin on H100 when LoRA is on)
  mlperf  run_mlperf.py --backend vllm --lora-modules lora=ADAPTER --accuracy (compiled, not eager) on
          16 synthetic prompts, greedy, 32 new tokens: it must run; its tokens' agreement with ours
All runs are greedy with ignore_eos (but the agreement rows), random prompt ids. Results:
DIR/results.jsonl (one JSON per line; --table re-prints the table from it).
Checked in /work/vllm_src (0.26): GptOssForCausalLM.is_3d_moe_weight, so LoRAModelManager reads
PEFT's target_parameters layout (experts.base_layer = gate_up_proj, experts = down_proj); an expert
adapter is expected to load. If it does not, rerun with --adapter of a `--targets attn` adapter.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.gptoss_gpu import emit, rand_prompts  # noqa: E402
from bench.lora_gpu_table import table  # noqa: E402
from gptoss.tools.make_lora import DELTA  # noqa: E402

AGREE = (16, 32)  # prompts, new tokens of the agreement runs
STOP_IDS = (200002, 200012, 199999)


def record(engine: str, what: str, spec_: str, init: float, wall: float, toks: int, **more) -> dict:
    r = {"engine": engine, "what": what, "lora": True, "spec": spec_, "init_s": round(init, 1)}
    return r | {"wall_s": round(wall, 2), "output_tok_s": round(toks / wall, 1)} | more


def spec(s: str) -> tuple[int, int, int]:
    n, lin, lout = (int(x) for x in s.split("x"))
    return n, lin, lout


def agree_dataset(out: Path) -> Path:
    """16 MLPerf-schema rows of random prompt ids, written once. Random ids, not data.synthetic's
    Harmony text: the GPU machine has no tokenizer package (openai_harmony)."""
    path = out / "agree16.parquet"
    if not path.exists():
        import pandas as pd

        prompts = rand_prompts(AGREE[0], 128, seed=13)
        frame = {"tok_input": prompts, "tok_input_len": [len(p) for p in prompts], "dataset": "gpqa_diamond"}
        pd.DataFrame(frame).to_parquet(path)
    return path


# ----------------------------------------------------------------------------- ours


def run_ours(args: argparse.Namespace) -> None:
    import gc

    import torch

    from gptoss.engine import EngineConfig, LLMEngine
    from gptoss.sampling import SamplingParams
    from harness.dataset import load_dataset

    def engine(lora: bool, max_num_seqs: int) -> tuple[LLMEngine, float]:
        t = time.perf_counter()
        eng = LLMEngine(
            EngineConfig(
                model_path=Path(args.model_path),
                device=args.device,
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=16384,
                max_model_len=args.max_model_len,
                lora=(f"lora={args.adapter}",) if lora else (),
            )
        )
        return eng, time.perf_counter() - t

    def timed(eng: LLMEngine, prompts: list[list[int]], out_len: int, lora: str | None) -> tuple[float, int]:
        sp = SamplingParams(max_new_tokens=out_len, temperature=0, ignore_eos=True)
        eng.generate(
            rand_prompts(8, 64, 123), SamplingParams(max_new_tokens=16, temperature=0, ignore_eos=True), lora
        )
        if args.device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        outs = eng.generate(prompts, sp, lora)
        return time.perf_counter() - t, sum(map(len, outs))

    n, lin, lout = spec(args.offline) if args.offline else (0, 0, 0)
    prompts = rand_prompts(n, lin, seed=lin * 7 + n)
    for lora in (False, True) if args.offline else ():
        eng, init = engine(lora, 1024)
        wall, toks = timed(eng, prompts, lout, "lora" if lora else None)
        emit(args.rows, args.out, record("gptoss", "offline", args.offline, init, wall, toks, lora=lora))
        del eng
        gc.collect()
        if args.device == "cuda":
            torch.cuda.empty_cache()
    eng, init = engine(True, 16)
    if args.c16:
        n, lin, lout = spec(args.c16)
        wall, toks = timed(eng, rand_prompts(n, lin, seed=lin * 11 + n), lout, "lora")
        emit(args.rows, args.out, record("gptoss", "c16", args.c16, init, wall, toks))
    agree = [p.tolist() for p in load_dataset(agree_dataset(args.out)).prompts]
    sp = SamplingParams(max_new_tokens=AGREE[1], temperature=0, stop_token_ids=STOP_IDS)
    emit(
        args.rows, args.out, {"engine": "gptoss", "what": "greedy", "tokens": eng.generate(agree, sp, "lora")}
    )
    # The control of the teacher-forced check (run_vllm): the base model's tokens for the same prompts.
    base = eng.generate(agree, sp, None)
    emit(args.rows, args.out, {"engine": "gptoss", "what": "greedy_base", "tokens": base})


# ----------------------------------------------------------------------------- vLLM


def run_vllm(args: argparse.Namespace) -> None:
    # flashinfer is not carried to the GPU machine (bench/vllm_gpu.sh); vLLM's sampler would import it.
    for k, v in {
        "VLLM_USE_FLASHINFER_SAMPLER": "0",
        "VLLM_NO_USAGE_STATS": "1",
        "HF_HUB_OFFLINE": "1",
    }.items():
        os.environ.setdefault(k, v)
    # vLLM first: touching torch.cuda here would keep vLLM's forked engine core off the GPU.
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    kwargs = {
        "model": args.model_path,
        "skip_tokenizer_init": True,
        "max_model_len": args.max_model_len,
        "enable_lora": True,
        "max_lora_rank": args.rank,
        "max_loras": 1,
        "max_num_seqs": 16,
    }
    if args.vllm_moe_backend != "auto":
        kwargs["moe_backend"] = args.vllm_moe_backend
    t = time.perf_counter()
    llm = LLM(**kwargs)
    init = time.perf_counter() - t
    lora = LoRARequest("lora", 1, str(Path(args.adapter).resolve()))
    if not args.c16:
        teacher_forced(args, llm, lora)
        return
    n, lin, lout = spec(args.c16)
    prompts = [{"prompt_token_ids": p} for p in rand_prompts(n, lin, seed=lin * 11 + n)]
    sp = SamplingParams(max_tokens=lout, temperature=0, ignore_eos=True, detokenize=False)
    warm = [{"prompt_token_ids": p} for p in rand_prompts(8, 64, 123)]
    llm.generate(
        warm, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True), lora_request=lora, use_tqdm=False
    )
    t = time.perf_counter()
    outs = llm.generate(prompts, sp, lora_request=lora, use_tqdm=False)
    wall = time.perf_counter() - t
    toks = sum(len(o.outputs[0].token_ids) for o in outs)
    info = {"vllm": vllm.__version__, "moe_backend": args.vllm_moe_backend}
    emit(args.rows, args.out, record("vllm", "c16", args.c16, init, wall, toks, **info))
    teacher_forced(args, llm, lora)


def teacher_forced(args: argparse.Namespace, llm, lora) -> None:
    """vLLM with the adapter scores our greedy continuations (prompt_logprobs): at each of our
    tokens, is it vLLM's top-1, and how many nats below vLLM's top-1 is it? Each position sees the
    same prefix in both engines, so bf16 differences do not compound as in free-running greedy,
    where the random checkpoint's near-ties make two engines part at the first few tokens. The base
    model's tokens (greedy_base) are the control: an adapter vLLM applied differently would score
    our adapted tokens no better than those."""
    from vllm import SamplingParams

    from harness.dataset import load_dataset

    ours = {r["what"]: r["tokens"] for r in _rows(args.out) if r["engine"] == "gptoss" and "tokens" in r}
    prompts = [p.tolist() for p in load_dataset(agree_dataset(args.out)).prompts]
    sp = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=1, detokenize=False)
    # (our tokens, vLLM's adapter, label): the third is the calibration, base model against base model:
    # how far apart the two engines' bf16 numerics put our tokens with no adapter involved.
    runs = (
        ("greedy", lora, "greedy"),
        ("greedy_base", lora, "greedy_base"),
        ("greedy_base", None, "base_base"),
    )
    failed: list[str] = []
    for what, req, label in runs:
        if what not in ours:
            continue
        seqs = [{"prompt_token_ids": p + c} for p, c in zip(prompts, ours[what], strict=True)]
        try:
            outs = llm.generate(seqs, sp, lora_request=req, use_tqdm=False)
        except Exception as e:  # noqa: BLE001
            # the table shows it; the part still fails, after the other scorings
            emit(
                args.rows,
                args.out,
                {"engine": "vllm", "what": "teacher_forced", "of": label, "error": repr(e)},
            )
            failed.append(f"{label}: {e!r}")
            continue
        top1 = 0
        all_gaps: list[float] = []
        for p, c, o in zip(prompts, ours[what], outs, strict=True):
            for i, tok in enumerate(c):
                lps = o.prompt_logprobs[len(p) + i]  # {token id: Logprob} at our token's position
                gap = max(v.logprob for v in lps.values()) - lps[tok].logprob
                top1 += lps[tok].rank == 1
                all_gaps.append(gap)
        gaps = sorted(all_gaps)
        r = {"engine": "vllm", "what": "teacher_forced", "of": label, "positions": len(gaps)}
        r |= {"top1": round(top1 / max(1, len(gaps)), 4), "median_gap": round(gaps[len(gaps) // 2], 4)}
        emit(args.rows, args.out, r | {"p90_gap": round(gaps[int(0.9 * (len(gaps) - 1))], 4)})
    if failed:
        raise RuntimeError(f"teacher-forced scoring failed: {'; '.join(failed)}")


def _rows(out: Path) -> list[dict]:
    path = out / "results.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def run_mlperf_vllm(args: argparse.Namespace) -> None:
    """run_mlperf.py --backend vllm --lora-modules, accuracy mode, greedy: its logged tokens."""
    conf = args.out / "greedy32.json"
    conf.write_text(json.dumps({"temperature": 0.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": AGREE[1]}))
    outdir = args.out / "mlperf_vllm_lora"
    cmd = [sys.executable, str(REPO / "run_mlperf.py"), "--backend", "vllm", "--scenario", "offline"]
    cmd += ["--accuracy", "--model-path", args.model_path, "--input-file", str(agree_dataset(args.out))]
    cmd += ["--output-dir", str(outdir), "--generation-config", str(conf), "--max-model-len", "2048"]
    cmd += [
        "--lora-modules",
        f"lora={args.adapter}",
        "--vllm-arg",
        f"max_lora_rank={args.rank}",
    ]  # not --enforce-eager: vLLM 0.26's eager LoRA step fails (backends/vllm_args.py refuses it)
    t = time.perf_counter()
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=dict(os.environ, VLLM_USE_FLASHINFER_SAMPLER="0")
    )
    (args.out / "mlperf_vllm_lora.log").write_text(proc.stdout + proc.stderr)
    log = outdir / "offline" / "accuracy" / "mlperf_log_accuracy.json"
    tokens = None
    if log.exists():
        import numpy as np

        entries = json.loads(log.read_text())
        by = {e["qsl_idx"]: np.frombuffer(bytes.fromhex(e["data"]), dtype="<i4").tolist() for e in entries}
        tokens = [by.get(i, []) for i in range(AGREE[0])]
    # Exit 1 is expected: random weights fail the accuracy score; 2 means vLLM refused the setup.
    r = {"engine": "vllm", "what": "greedy", "via": "run_mlperf --lora-modules", "exit": proc.returncode}
    emit(args.rows, args.out, r | {"wall_s": round(time.perf_counter() - t, 1), "tokens": tokens})
    if tokens is None:
        print("\n".join((proc.stdout + proc.stderr).splitlines()[-15:]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", default="/tmp/ck20")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--parts", default="ours,vllm,mlperf", help="comma list of ours, vllm, mlperf")
    ap.add_argument("--adapter", default=None, help="default: OUT/lora-rR, written by gptoss.make_lora")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--delta", type=float, default=DELTA, help="make_lora's --delta: the adapter's strength")
    ap.add_argument("--offline", default="1000x1024x1024", help="NxINxOUT ('': skip the Offline runs)")
    ap.add_argument(
        "--c16",
        default="1000x215x199",
        help="NxINxOUT at concurrency 16 (the seed's ShareGPT means; '': skip)",
    )
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--vllm-moe-backend", default="auto")
    ap.add_argument("--device", default="cuda", help="ours: cuda; cpu for a smoke run on a tiny checkpoint")
    ap.add_argument("--table", action="store_true", help="only print the table of OUT/results.jsonl")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    strength = "" if args.delta == DELTA else f"-d{args.delta:g}"
    args.adapter = args.adapter or str(args.out / f"lora-r{args.rank}{strength}")
    args.rows = []
    if args.child:
        {"ours": run_ours, "vllm": run_vllm, "mlperf": run_mlperf_vllm}[args.child](args)
        return
    if not args.table:
        if not (Path(args.adapter) / "adapter_config.json").exists():
            from gptoss.tools.make_lora import write_adapter

            write_adapter(args.model_path, args.adapter, args.rank, seed=0, delta=args.delta)
            print(f"adapter: {args.adapter} (rank {args.rank}, delta {args.delta:g})", flush=True)
        failed = []
        for part in args.parts.split(","):
            cmd = [sys.executable, __file__, *sys.argv[1:], "--child", part, "--adapter", args.adapter]
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            (args.out / f"{part}.log").write_text(proc.stdout)
            for line in proc.stdout.splitlines():
                if line.startswith("RESULT "):
                    r = json.loads(line[7:])
                    if r.get("tokens"):  # greedy tokens: results.jsonl has them
                        r["tokens"] = f"{len(r['tokens'])} sequences"
                    print("RESULT " + json.dumps(r), flush=True)
            if proc.returncode:
                failed.append(part)
                print(
                    f"{part} exited {proc.returncode}; the end of {part}.log:\n"
                    + "\n".join(proc.stdout.splitlines()[-15:])
                )
    table(_rows(args.out))
    if not args.table and failed:
        sys.exit(1)


if __name__ == "__main__":
    main()

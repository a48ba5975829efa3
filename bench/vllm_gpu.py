"""Offline tokens/s of `run_mlperf.py --backend vllm` (through LoadGen) next to vLLM's own LLM.generate.

    python bench/vllm_gpu.py all --model-path CKPT --out DIR [--requests 1000 --input-len 1024
        --output-len 512] [-- ENGINE FLAGS, e.g. --max-num-seqs 512]

`all` writes one random-prompt dataset (MLCommons schema, per-row max_output_len, so every request
generates exactly --output-len tokens with ignore_eos), then runs two processes on it, each with
the same engine flags and the harness's default MLPerf sampling (temperature 1, top_p 1, no top-k):
  llm      vLLM's offline LLM class: LLM(**the backend's engine args).generate(all prompts)
  harness  the harness: run_mlperf's main() Offline, once per output kind (FINAL_ONLY, DELTA), on
           one engine built by the backend's create() from the same flags (engine start is slow on
           a GPU: torch.compile and CUDA-graph capture, about 2 min)
Both warm up on the same 64 short requests first. Results go to DIR/results.jsonl and a table.
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

WARMUP = (64, 32, 16)  # requests, prompt tokens, output tokens


def emit(out: Path, record: dict) -> None:
    print("RESULT " + json.dumps(record), flush=True)
    with open(out / "results.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")


def make_dataset(path: Path, n: int, input_len: int, output_len: int, seed: int = 0) -> Path:
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    prompts = rng.integers(0, 200_000, size=(n, input_len), dtype=np.int64)
    pd.DataFrame(
        {
            "tok_input": list(prompts),
            "tok_input_len": [input_len] * n,
            "dataset": ["gpqa_diamond"] * n,
            "max_output_len": [output_len] * n,
        }
    ).to_parquet(path)
    return path


def _prompts(dataset: Path) -> tuple[list[list[int]], list[int]]:
    import pandas as pd

    df = pd.read_parquet(dataset)
    return [list(map(int, p)) for p in df["tok_input"]], [int(n) for n in df["max_output_len"]]


def _warmup_prompts() -> list[list[int]]:
    import random

    rng = random.Random(123)
    n, length, _ = WARMUP
    return [[rng.randrange(200_000) for _ in range(length)] for _ in range(n)]


def _options(model_path: Path, engine_flags: list[str]):
    from backends.vllm import VllmOptions
    from harness.options import parse_options

    return parse_options(VllmOptions, engine_flags, prog="engine flags")


# ----------------------------------------------------------------------------- llm (vLLM alone)


def run_llm(args) -> None:
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform

    from backends.vllm import engine_kwargs
    from harness.generation import load_sampling

    # Ask vLLM's platform, as the backend does: torch.cuda would initialise CUDA in this process,
    # and vLLM's forked engine core then cannot use it.
    kwargs = engine_kwargs(
        args.model_path, _options(args.model_path, args.engine_flags), on_cpu=current_platform.is_cpu()
    )

    base = load_sampling(None, accuracy=False)  # the harness's MLPerf sampling settings
    prompts, lens = _prompts(args.dataset)
    assert len(set(lens)) == 1, "one output length per dataset"

    def params(n: int) -> SamplingParams:
        return SamplingParams(
            max_tokens=n,
            temperature=base.temperature,
            top_p=base.top_p,
            top_k=base.top_k,
            ignore_eos=True,
            detokenize=False,
        )

    t0 = time.perf_counter()
    llm = LLM(**kwargs)
    init_s = time.perf_counter() - t0
    llm.generate([{"prompt_token_ids": p} for p in _warmup_prompts()], params(WARMUP[2]), use_tqdm=False)
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params(lens[0]), use_tqdm=False)
    wall = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    emit(
        args.out,
        {
            "what": "vllm LLM.generate",
            "vllm": vllm.__version__,
            "requests": len(prompts),
            "output_tokens": tokens,
            "wall_s": round(wall, 3),
            "tok_s": round(tokens / wall, 1),
            "engine_init_s": round(init_s, 1),
            "engine_args": {k: repr(v) for k, v in kwargs.items()},
        },
    )


# ----------------------------------------------------------------------------- harness (LoadGen)


class Lent:
    """The one started engine, lent to each run: entering and leaving a run neither starts nor stops it."""

    def __init__(self, engine, final_only: bool) -> None:
        self._engine, self._final_only = engine, final_only
        self.name, self.max_model_len, self.vocab_size = engine.name, engine.max_model_len, engine.vocab_size

    async def __aenter__(self):
        self._engine.final_only = self._final_only
        return self

    async def __aexit__(self, *exc) -> None:
        pass

    def stream(self, prompt, params):
        return self._engine.stream(prompt, params)

    def describe(self):
        return self._engine.describe()


def run_harness(args) -> None:
    import asyncio

    from backends import vllm as vllm_backend
    from harness import cli
    from harness.config import RunConfig, SamplingParams
    from harness.loop import shared_loop

    prompts, _ = _prompts(args.dataset)
    common = [
        "--backend",
        "vllm",
        "--scenario",
        "offline",
        "--model-path",
        str(args.model_path),
        "--input-file",
        str(args.dataset),
        "--min-duration",
        "0",
        "--min-query-count",
        str(len(prompts)),
        *args.engine_flags,
    ]
    cfg = RunConfig(
        backend="vllm",
        scenario="offline",
        input_file=args.dataset,
        output_dir=args.out,
        sampling=SamplingParams(max_new_tokens=WARMUP[2]),
        model_path=args.model_path,
        backend_options=_options(args.model_path, args.engine_flags),
    )
    t0 = time.perf_counter()
    engine = vllm_backend.create(cfg)
    loop = shared_loop()
    loop.run(engine.__aenter__())
    init_s = time.perf_counter() - t0

    async def warm():
        p = SamplingParams(max_new_tokens=WARMUP[2], temperature=1.0, ignore_eos=True)
        await asyncio.gather(*(_drain(engine.stream(q, p)) for q in _warmup_prompts()))

    loop.run(warm())
    real_create = vllm_backend.create
    try:
        for kind in args.kinds:

            def create(c, kind=kind):
                real_create(c)  # the run's own flags still go through the real checks
                return Lent(engine, final_only=kind == "final")

            vllm_backend.create = create
            out_dir = args.out / f"harness_{kind}"
            t0 = time.perf_counter()
            code = cli.main(
                ["run_mlperf.py", *common, "--output-dir", str(out_dir), "--vllm-output-kind", kind]
            )
            wall = time.perf_counter() - t0
            rec = json.loads((out_dir / "offline" / "performance" / "run.json").read_text())
            res, q = rec.get("result", {}), rec.get("queries", {})
            emit(
                args.out,
                {
                    "what": f"harness LoadGen Offline ({'FINAL_ONLY' if kind == 'final' else 'DELTA'})",
                    "exit_code": code,
                    "validity": res.get("validity"),
                    "requests": q.get("issued"),
                    "output_tokens": q.get("output_tokens"),
                    "failed": rec.get("failures", {}).get("count"),
                    "tok_s": res.get("tokens_per_s"),
                    "run_wall_s": round(wall, 1),
                    "engine_init_s": round(init_s, 1),
                },
            )
    finally:
        vllm_backend.create = real_create
        loop.run(engine.__aexit__(None, None, None))


async def _drain(agen) -> None:
    async for _ in agen:
        pass


# ----------------------------------------------------------------------------- all


def _table(out: Path) -> None:
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    ref = next((r for r in rows if r["what"] == "vllm LLM.generate"), None)
    print(f"\n{'measurement':<36} {'out tok/s':>10} {'vs LLM.generate':>16} {'requests':>9} {'tokens':>10}")
    for r in rows:
        ratio = f"{r['tok_s'] / ref['tok_s']:.4f}" if ref and r.get("tok_s") else "-"
        print(
            f"{r['what']:<36} {r.get('tok_s') or 0:>10,.0f} {ratio:>16} "
            f"{r.get('requests')!s:>9} {r.get('output_tokens')!s:>10}"
        )


def run_all(args) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.jsonl").unlink(missing_ok=True)
    dataset = make_dataset(args.out / "bench.parquet", args.requests, args.input_len, args.output_len)
    print(
        f"dataset: {args.requests} prompts x {args.input_len} tokens -> {args.output_len} tokens each",
        flush=True,
    )
    me = [sys.executable, str(Path(__file__).resolve())]
    tail = [
        "--model-path",
        str(args.model_path),
        "--dataset",
        str(dataset),
        "--out",
        str(args.out),
        "--",
        *args.engine_flags,
    ]
    rc = 0
    for mode, extra in (("llm", []), ("harness", ["--kinds", *args.kinds])):
        log = args.out / f"{mode}.log"
        print(f"--- {mode} (log: {log})", flush=True)
        with open(log, "w") as f:
            proc = subprocess.run(
                [*me, mode, *extra, *tail],
                stdout=f,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                env=os.environ | {"PYTHONUNBUFFERED": "1"},
            )
        print(
            "".join(line for line in log.read_text().splitlines(keepends=True) if line.startswith("RESULT")),
            end="",
        )
        if proc.returncode:
            print(
                f"{mode} exited {proc.returncode}; the end of its log:\n"
                + "".join(log.read_text().splitlines(keepends=True)[-30:])
            )
            rc = rc or proc.returncode
    _table(args.out)
    return rc


def main() -> int:
    argv = sys.argv[1:]
    engine_flags = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=("all", "llm", "harness"))
    ap.add_argument("--model-path", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dataset", type=Path, help="llm/harness: the dataset `all` wrote")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=512)
    ap.add_argument("--kinds", nargs="+", choices=("final", "delta"), default=["final", "delta"])
    args = ap.parse_args(argv)
    args.engine_flags = engine_flags
    if args.mode == "all":
        return run_all(args)
    (run_llm if args.mode == "llm" else run_harness)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

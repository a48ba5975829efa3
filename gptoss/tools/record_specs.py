"""Record the Triton kernel specializations that an engine's start-up and a short mixed run meet on
this GPU, into the manifest gptoss.precompile compiles from at start-up (gptoss/kernels/specs/
<backend>-<arch>.json), tagged with the model's shapes.

    python -m gptoss.tools.record_specs --model-path CKPT [--max-num-seqs 1024] [--prompts 256]
        [--max-model-len 4096 8192]
    python -m gptoss.tools.record_specs --prune   # after a kernel's parameters change, on any machine

A quarter of the recorded run's requests sample with top_p alone and a quarter with top_k + top_p,
so the sampling filters are recorded too. Run it on a GPU once a model (the random 20b and 120b
checkpoints have the released shapes) after a change to the kernels, and commit the manifest:
entries are added to what is there, each with the union of its tags; a manifest of another Triton
version is replaced. Recording works on a warm disk cache as on a cold one (in a new process every
specialization passes Triton's post-compile hook).

The decode attention's split count, a constexpr, follows the static key bound: a power of two up to
attention_settings.MAX_SPLITS, reached at 8,192 keys. So one length misses what another meets (2026-12-03,
H200: a manifest recorded at 4,096 lacked four attention and two sampling specializations that the
bench's 8,192 met, and the 20b warm-up compiled them: 8.5 s against 1.7 s). Each --max-model-len
(default 4096 and 8192; 131,072 met nothing 8,192 had not) is recorded in a process of its own, so two
engines never share the GPU's memory.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import time
from pathlib import Path

from gptoss.checkpoint import load_config
from gptoss.engine import EngineConfig, LLMEngine
from gptoss.precompile import SPECS_DIR, SpecRecorder, manifest_path, model_tag, prune_specs, save_specs
from gptoss.sampling import SamplingParams

# The key bounds recorded by default: the 120b bench's and the 20b bench's (and, past MAX_SPLITS'
# reach, every longer one's, the engine's default included).
LENGTHS = (4096, 8192)


def child_argv(args: argparse.Namespace, length: int) -> list[str]:
    """This tool's command line for one key bound of args."""
    argv = [sys.executable, "-m", "gptoss.tools.record_specs", "--model-path", str(args.model_path)]
    if args.out is not None:
        argv += ["--out", str(args.out)]
    return argv + [
        "--max-num-seqs",
        str(args.max_num_seqs),
        "--prompts",
        str(args.prompts),
        "--max-tokens",
        str(args.max_tokens),
        "--max-model-len",
        str(length),
    ]


def record_each(args: argparse.Namespace, run=subprocess.run) -> int:
    """One recording a key bound, one after another (each adds to the manifest); the first failure's
    exit status, after saying which bounds failed."""
    failed = [(n, rc) for n in args.max_model_len if (rc := run(child_argv(args, n)).returncode) != 0]
    for n, rc in failed:
        print(f"record_specs: the recording at --max-model-len {n} failed (exit {rc})", file=sys.stderr)
    return failed[0][1] if failed else 0


def recording_params(n: int, max_tokens: int) -> list[SamplingParams]:
    """The recorded run's requests: greedy, but every fourth (from the second) with top_p alone and
    every fourth (from the fourth) with top_k + top_p. So batches of many sizes draw filtered, and
    the manifest holds the filters' and the cut draw's specializations (the draw's chunk, a
    constexpr, follows the batch size) beside the greedy path's."""

    def params(i: int) -> SamplingParams:
        if i % 4 == 1:
            return SamplingParams(
                max_new_tokens=max_tokens, temperature=1.0, top_p=0.9, seed=i, ignore_eos=True
            )
        if i % 4 == 3:
            return SamplingParams(
                max_new_tokens=max_tokens, temperature=1.0, top_k=20, top_p=0.9, seed=i, ignore_eos=True
            )
        return SamplingParams(max_new_tokens=max_tokens, temperature=0.0, ignore_eos=True)

    return [params(i) for i in range(n)]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", type=Path)
    ap.add_argument("--out", type=Path, help="the manifest (default: this GPU's, in gptoss/kernels/specs)")
    # An instance's value: EngineConfig has slots, so the class attribute is the field's descriptor
    ap.add_argument("--max-num-seqs", type=int, default=EngineConfig().max_num_seqs)
    ap.add_argument(
        "--max-model-len",
        type=int,
        nargs="+",
        default=list(LENGTHS),
        help="key bounds to record at, each in its own process (default: 4096 8192)",
    )
    ap.add_argument(
        "--prompts", type=int, default=256, help="random prompts of 1 to 2048 tokens after start-up"
    )
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument(
        "--prune",
        action="store_true",
        help="no recording: drop the entries of --out (default: every manifest in gptoss/kernels/specs) "
        "that no longer match their kernels; needs no GPU",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.prune:
        for path in [args.out] if args.out else sorted(SPECS_DIR.glob("*.json")):
            gone = prune_specs(path)
            print(f"{path}: {len(gone)} entries dropped" + "".join(f"\n  {g}" for g in gone))
        return 0
    if args.model_path is None:
        ap.error("--model-path is required to record (or --prune)")

    import torch
    from triton.runtime import driver

    if not torch.cuda.is_available():
        print("record_specs: no CUDA device; the manifest lists what a GPU compiles", file=sys.stderr)
        return 2
    if len(args.max_model_len) > 1:
        return record_each(args)
    cfg = load_config(args.model_path)
    out = args.out or manifest_path(driver.active.get_current_target())
    t0 = time.perf_counter()
    with SpecRecorder() as rec:
        eng = LLMEngine(
            EngineConfig(
                args.model_path,
                device="cuda",
                max_num_seqs=args.max_num_seqs,
                max_model_len=args.max_model_len[0],
                precompile=False,  # the disk cache is irrelevant: every specialization passes the hook
            )
        )
        rng = random.Random(0)
        prompts = [
            [rng.randrange(cfg.vocab_size) for _ in range(rng.randrange(1, 2049))]
            for _ in range(args.prompts)
        ]
        eng.generate(prompts, recording_params(len(prompts), args.max_tokens))
    new = save_specs(out, model_tag(cfg), rec.specs)
    print(
        f"{len(rec.specs)} specializations of our kernels met at {model_tag(cfg)} in "
        f"{time.perf_counter() - t0:.1f} s; {new} new in {out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Helpers of the vllm backend tests: run configs from CLI flags, requests on the session engine, the
reference model's greedy tokens, logs read back."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np

from harness.config import RunConfig, SamplingParams

REPO = Path(__file__).resolve().parents[3]

# The flags the session engine is started with, as a user would type them. The batched tokens are
# given, so that Offline and Server runs build the same engine (unset, Server takes 2048 and Offline
# vLLM's own default).
ENGINE_FLAGS = [
    *("--enforce-eager", "--max-model-len", "512", "--max-num-seqs", "64", "--dtype", "float32"),
    *("--max-num-batched-tokens", "2048"),
]
INLINE = ["--vllm-process", "inline"]  # AsyncLLM in this process whatever the scenario
MAX_MODEL_LEN = 512


def make_dataset(path: Path, rows: int, *, seed: int, prompt_len=(20, 200), output_len=(4, 12)) -> Path:
    """An MLCommons-schema parquet of random prompts, with per-row output lengths (ignore_eos).

    No ground_truth column: these runs check tokens, and random-weight outputs are not graded."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    prompts = [
        rng.integers(0, 200_000, size=int(rng.integers(*prompt_len)), dtype=np.int64) for _ in range(rows)
    ]
    pd.DataFrame(
        {
            "tok_input": [p.tolist() for p in prompts],
            "tok_input_len": [len(p) for p in prompts],
            "dataset": ["gpqa_diamond"] * rows,
            "max_output_len": rng.integers(*output_len, size=rows).tolist(),
        }
    ).to_parquet(path)
    return path


def parse_flags(flags: list[str]):
    from backends.vllm import VllmOptions
    from harness.options import parse_options

    return parse_options(VllmOptions, flags)


def run_config(
    model_path: Path, flags: list[str], scenario: str = "server", output_dir: Path = Path("unused"), **kw
) -> RunConfig:
    return RunConfig(
        backend="vllm",
        scenario=scenario,
        input_file=None,
        output_dir=output_dir,
        sampling=SamplingParams(max_new_tokens=16, temperature=0.0),
        model_path=model_path,
        backend_options=parse_flags(flags),
        **kw,
    )


def collect(loop, backend, prompt: list[int], params: SamplingParams) -> list[list[int]]:
    """Every chunk the backend yields for one request."""

    async def go():
        return [chunk async for chunk in backend.stream(prompt, params)]

    return loop.run(go(), timeout=600)


def generate(loop, backend, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    """Concurrent requests, the way the SUT sends them; the flattened output of each."""

    async def one(p):
        out: list[int] = []
        async for chunk in backend.stream(p, params):
            out += chunk
        return out

    async def go():
        return await asyncio.gather(*(one(p) for p in prompts))

    return loop.run(go(), timeout=600)


def greedy_reference(model_path: Path, prompts: list[list[int]], n: int) -> list[list[int]]:
    """Greedy tokens of gptoss' reference model (float32, one sequence at a time, dense KV)."""
    import torch

    from gptoss.attention_ref import DenseAttention
    from gptoss.model import GptOss

    torch.set_num_threads(1)
    model = GptOss.from_checkpoint(model_path, dtype=torch.float32)
    outs = []
    for prompt in prompts:
        attn = DenseAttention()
        hidden = model(torch.tensor(prompt), torch.arange(len(prompt)), attn)
        out: list[int] = []
        for i in range(n):
            out.append(int(model.compute_logits(hidden[-1:]).argmax(-1)))
            hidden = model(torch.tensor(out[-1:]), torch.tensor([len(prompt) + i]), attn)
        outs.append(out)
    return outs


def accuracy_tokens(log_dir: Path) -> dict[int, dict[str, list[int]]]:
    """mlperf_log_accuracy.json -> {qsl_idx: {'tokens': [...], 'first': [...]?}} (little-endian int32)."""
    out = {}
    for e in json.loads((log_dir / "mlperf_log_accuracy.json").read_text()):
        rec = {"tokens": np.frombuffer(bytes.fromhex(e["data"]), dtype="<i4").tolist()}
        if "token_data" in e:
            rec["first"] = np.frombuffer(bytes.fromhex(e["token_data"]), dtype="<i4").tolist()
        assert e["qsl_idx"] not in out, f"sample {e['qsl_idx']} logged twice"
        out[e["qsl_idx"]] = rec
    return out


def processes_with(marker: str, live: bool = False) -> list[int]:
    """pids whose environment carries `marker` (every process a run started inherits it, so children
    of a finished run would still have it); live: zombies left out."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker.encode() in (d / "environ").read_bytes() and not (
                    live and b"Z" == (d / "stat").read_bytes().rsplit(b")", 1)[1].split()[0]
                ):
                    found.append(int(d.name))
            except OSError:  # noqa: S112 - the process exited while we looked: it is not left over
                continue
    return found

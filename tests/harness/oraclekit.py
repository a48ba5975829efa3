"""An oracle for the fake backend: GPQA rows answered right (in Harmony, at the row's output length),
so that short real runs pass accuracy, TEST07 and TEST09 and a submission can be built from them.
Also the helpers that run the pieces of a submission into an OUTPUT_DIR."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import pytest

import backends
from evaluation.harmony import tokenize
from tests.harness import fakes
from tests.harness.runkit import run_cli

ANSWERS: dict[tuple[int, ...], str] = {}  # prompt -> the GPQA letter it asks for
_plain_tokens = fakes.expected_tokens


def write_gpqa(path: Path, rows: int = 16, output_len: tuple[int, int] = (1200, 1350), seed: int = 3) -> Path:
    """GPQA rows whose lengths average inside TEST09's 1150.38-1406.02 tokens."""
    from data.synthetic import make

    df = make(rows, prompt_len=(110, 160), output_len=output_len, seed=seed, datasets=("gpqa_diamond",))
    df.to_parquet(path)
    for ids, truth in zip(df["tok_input"], df["ground_truth"], strict=True):
        ANSWERS[tuple(int(t) for t in ids)] = truth
    return path


def oracle_tokens(prompt: list[int], params) -> list[int]:
    """The right answer for a known GPQA prompt, padded in the analysis channel to the asked length;
    any other prompt gets the plain fake's tokens."""
    truth = ANSWERS.get(tuple(prompt))
    if truth is None:
        return _plain_tokens(prompt, params)
    final = f"<|start|>assistant<|channel|>final<|message|>**{truth}**<|return|>"
    head = "<|channel|>analysis<|message|>"
    base = len(tokenize(head + "<|end|>" + final))
    pad = max(params.max_new_tokens - base, 0) if params.ignore_eos else 4
    return tokenize(head + " ok" * pad + "<|end|>" + final)


@contextmanager
def fake_with_oracle(oracle: bool = True):
    """'--backend fake' answering GPQA right (oracle=False: the plain fake, whose tokens answer
    nothing), for fixtures wider than one test."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(backends, "SPECS", dict(backends.SPECS))
        mp.setattr(backends, "NAMES", backends.NAMES)
        fakes.register()
        if oracle:
            mp.setattr(fakes, "expected_tokens", oracle_tokens)
        yield


FAST = ["--backend", "fake", "--fake-chunk", "512"]


def run_piece(out: Path, scenario: str, mode: str, data: Path, *extra) -> int:
    """One piece of a submission: performance | accuracy | TEST07 | TEST09, into OUTPUT_DIR `out`."""
    args = [*FAST, "--scenario", scenario, "--input-file", data, "--output-dir", out]
    if scenario != "offline":
        args += ["--target-qps", 1000]
    if mode == "accuracy":
        args.append("--accuracy")
    elif mode.startswith("TEST"):
        args += ["--compliance", mode]
    elif scenario == "offline":
        args += ["--min-duration", 0]
    else:  # p99 early stopping needs about 460 queries under the limits
        args += ["--min-duration", 0, "--min-query-count", 500]
    return run_cli([*args, *extra])  # last: a flag given twice takes the last value


def run_submission_pieces(out: Path, data: Path, scenarios=("offline", "server")) -> Path:
    for scenario in scenarios:
        for mode in ("performance", "accuracy", "TEST07", "TEST09"):
            code = run_piece(out, scenario, mode, data)
            # A Server compliance run issues each row once: too few queries for LoadGen to call it
            # VALID (exit 3), which the checker does not ask of TEST07/TEST09; their verdict must pass.
            ok = (0, 3) if scenario != "offline" and mode.startswith("TEST") else (0,)
            assert code in ok, f"{scenario} {mode} exited {code}"
    return out

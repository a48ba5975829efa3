"""lm-eval drives gptoss.serve's /v1/completions with the offline tokenizer (the server's /tokenize).

lm-eval 0.4.13 downgrades python-dateutil, so it lives in its own venv (see README):
    python3 -m venv .venv-lmeval && .venv-lmeval/bin/pip install 'lm-eval[api]==0.4.13'
The test finds `lm_eval` there, in $LM_EVAL, or on PATH, and is skipped without it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from tests.backends.httpkit import ROOT
from tests.gptoss.serve.servekit import LMEVAL_DIR, lmeval_prompts

pytestmark = pytest.mark.timeout(400)


def _lm_eval() -> str | None:
    for candidate in (
        os.environ.get("LM_EVAL"),
        str(ROOT / ".venv-lmeval" / "bin" / "lm_eval"),
        shutil.which("lm_eval"),
    ):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def test_lm_eval_local_completions_against_gptoss_serve(gptoss_server, tiny_checkpoint, oracle, tmp_path):
    lm_eval = _lm_eval()
    if lm_eval is None:
        pytest.skip(
            "lm_eval is not installed: python3 -m venv .venv-lmeval && "
            ".venv-lmeval/bin/pip install 'lm-eval[api]==0.4.13' (own venv: it downgrades python-dateutil)"
        )
    from gptoss.serve.text import Tokenizer

    cmd = [
        lm_eval,
        "run",
        "--model",
        "local-completions",
        "--model_args",
        f"base_url={gptoss_server}/v1/completions",
        f"model={tiny_checkpoint.name}",
        "tokenizer_backend=remote",
        "num_concurrent=1",
        "max_retries=1",
        "--tasks",
        "gptoss_tiny",
        "--include_path",
        str(LMEVAL_DIR),
        "--output_path",
        str(tmp_path / "out"),
        "--log_samples",
    ]
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=360)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (samples_file,) = (tmp_path / "out").rglob("samples_gptoss_tiny_*.jsonl")
    (results_file,) = (tmp_path / "out").rglob("results_*.json")
    samples = sorted(
        (json.loads(x) for x in samples_file.read_text().splitlines()), key=lambda s: s["doc_id"]
    )
    results = json.loads(results_file.read_text())
    assert results["n-samples"]["gptoss_tiny"]["effective"] == len(samples) == 6
    assert "exact_match,none" in results["results"]["gptoss_tiny"]
    tok = Tokenizer()
    for sample, prompt in zip(samples, lmeval_prompts(), strict=True):
        # lm-eval tokenized the prompt with our /tokenize and sent ids; the text it got back is the
        # engine's greedy tokens (max_gen_toks 8), decoded, cut at its stop sequence.
        assert tok.encode(sample["arguments"]["gen_args_0"]["arg_0"]) == prompt
        text = tok.decode(oracle[tuple(prompt)][:8], skip_special=True).split("\n\n")[0]
        assert sample["resps"][0][0] == text

"""Helpers of the gptoss.serve tests: the prompts of the lm-eval task in lmeval/."""

from __future__ import annotations

import json
from pathlib import Path

LMEVAL_DIR = Path(__file__).with_name("lmeval")
LMEVAL_TASK = LMEVAL_DIR / "gptoss_tiny.jsonl"


def lmeval_prompts() -> list[list[int]]:
    """The token ids lm-eval sends for lmeval/gptoss_tiny.yaml (doc_to_text, tokenized)."""
    from gptoss.serve.text import Tokenizer

    tok = Tokenizer()
    docs = [json.loads(line) for line in LMEVAL_TASK.read_text().splitlines() if line.strip()]
    return [tok.encode(f"Question: {d['question']}\nAnswer:") for d in docs]

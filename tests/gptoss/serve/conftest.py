"""Fixtures of the gptoss.serve tests: the in-process engine's greedy tokens, the oracle."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.backends.httpkit import PROMPTS, engine_greedy
from tests.gptoss.serve.servekit import lmeval_prompts


@pytest.fixture(scope="session")
def oracle(tiny_checkpoint: Path) -> dict[tuple, list[int]]:
    return engine_greedy(tiny_checkpoint, PROMPTS + lmeval_prompts())

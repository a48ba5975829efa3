"""Fixtures of the harness tests: the fake backend and small synthetic datasets (helpers: runkit.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

import backends
from tests.harness import fakes


@pytest.fixture
def fake_backend(monkeypatch):
    """'--backend fake' for in-process runs; the registry is restored afterwards."""
    monkeypatch.setattr(backends, "SPECS", dict(backends.SPECS))
    monkeypatch.setattr(backends, "NAMES", backends.NAMES)
    fakes.register()
    fakes.LAST = None
    yield fakes


@pytest.fixture(scope="session")
def synth_parquet(tmp_path_factory) -> Path:
    """16 rows, per-row output lengths 4..24 (so outputs have several chunks)."""
    from data.synthetic import make

    path = tmp_path_factory.mktemp("data") / "synth16.parquet"
    make(16, prompt_len=(110, 180), output_len=(4, 24), seed=1).to_parquet(path)
    return path


@pytest.fixture(scope="session")
def synth_no_lens(tmp_path_factory) -> Path:
    """12 rows without max_output_len: the fake model picks its own (EOS-like) length."""
    from data.synthetic import make

    path = tmp_path_factory.mktemp("data") / "synth12.parquet"
    make(12, prompt_len=(110, 140), output_len=None, seed=2).to_parquet(path)
    return path

"""backends.gptoss: EngineConfig as its options, lazy torch import, streaming through the Backend
protocol (engine SamplingParams converted from the harness's), and the default checkpoint."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from backends import gptoss as backend
from backends.base import BackendError, SamplingParams
from gptoss.engine import EngineConfig
from harness.config import RunConfig

GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)


def test_harness_sampling_params_become_the_engines_own():
    from gptoss.sampling import SamplingParams as EngineSamplingParams

    p = SamplingParams(
        max_new_tokens=7, temperature=0.5, top_p=0.9, top_k=3, ignore_eos=True, seed=4, stop_token_ids=(1, 2)
    )
    assert backend.engine_params(p) == EngineSamplingParams(7, 0.5, 0.9, 3, True, 4, (1, 2))
    assert backend.GptossBackend.Options is EngineConfig and backend.GptossBackend.in_process


def test_importing_the_backend_does_not_import_torch():
    code = "import sys, backends.gptoss, gptoss.engine; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


def run_config(path, **opts):
    opts = {"device": "cpu", "dtype": "float32", "kv_cache_tokens": 2048, "max_num_seqs": 4} | opts
    return RunConfig(
        backend="gptoss",
        scenario="offline",
        input_file=None,
        output_dir=Path("."),
        sampling=GREEDY,
        model_path=path,
        backend_options=EngineConfig(**opts),
    )


def test_stream_yields_the_engines_tokens(tiny_checkpoint):
    from gptoss.engine import LLMEngine

    prompt = [11, 22, 33, 44, 55]
    engine = LLMEngine(EngineConfig(tiny_checkpoint, dtype="float32", kv_cache_tokens=2048))
    want = engine.generate([prompt], backend.engine_params(GREEDY))[0]

    async def main():
        async with backend.create(run_config(tiny_checkpoint, max_model_len=64)) as b:
            chunks = [c async for c in b.stream(prompt, GREEDY)]
            with pytest.raises(BackendError, match="gptoss refused the request: prompt has 64 tokens"):
                async for _ in b.stream([1] * 64, GREEDY):
                    pass
            return chunks, b.describe(), (b.max_model_len, b.vocab_size)

    chunks, info, limits = asyncio.run(main())
    assert limits == (64, 201088)  # what the harness checks the dataset against, before LoadGen
    assert all(chunks) and [t for c in chunks for t in c] == want
    assert info["max_model_len"] == 64 and info["kv_cache_tokens"] == 2048 and info["device"] == "cpu"
    # 2048 slots, one pool: a 64-token sequence takes 4 full + 4 ring blocks of 16 -> 128 // 8
    assert (info["kv_pool"], info["kv_blocks"], info["kv_max_seqs"]) == ("shared", 128, 16)
    assert info["model_path"] == str(tiny_checkpoint) and info["dense_moe"] is True


def test_bad_engine_options_fail_at_start(tiny_checkpoint):
    async def main():
        async with backend.create(run_config(tiny_checkpoint, kv_cache_tokens=256, max_model_len=1024)):
            pass

    with pytest.raises(
        BackendError,
        match=r"KV cache holds 128 tokens \(256 slots, with a sequence's last 128 for the sliding layers\), "
        r"fewer than max_model_len 1024",
    ):
        asyncio.run(main())


def test_default_checkpoint_is_made_once(tmp_path, monkeypatch):
    from gptoss.default import default_checkpoint

    monkeypatch.setenv("MLPERF_DATA_DIR", str(tmp_path))
    path = default_checkpoint()
    assert path.parent == tmp_path and (path / "config.json").is_file()
    stamp = (path / "config.json").stat().st_mtime_ns
    assert default_checkpoint() == path and (path / "config.json").stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary directory left behind

    async def main():
        async with backend.create(run_config(None)) as b:
            return b.describe()["model_path"], [c async for c in b.stream([5, 6, 7], GREEDY)]

    used, chunks = asyncio.run(main())
    assert used == str(path) and sum(map(len, chunks)) == GREEDY.max_new_tokens


def test_a_damaged_cached_default_checkpoint_is_written_again_and_says_so(tmp_path, monkeypatch, caplog):
    from gptoss.default import damage, default_checkpoint

    monkeypatch.setenv("MLPERF_DATA_DIR", str(tmp_path))
    path = default_checkpoint()
    weights = path / "model.safetensors"
    good = weights.read_bytes()
    for what, spoil, reason in [
        ("truncated weights", lambda: weights.write_bytes(good[: len(good) // 2]), "model.safetensors"),
        ("garbled config", lambda: (path / "config.json").write_text("{not json"), "config.json"),
        ("no weights", lambda: weights.unlink(), "no .safetensors file"),
    ]:
        spoil()
        assert reason in damage(path), what
        with caplog.at_level(logging.WARNING, logger="gptoss.default"):
            assert default_checkpoint() == path
        assert f"the cached default checkpoint {path} is damaged" in caplog.text, what
        assert damage(path) is None and weights.read_bytes() == good, what  # the same seed-0 weights again
        caplog.clear()


def test_a_truncated_checkpoint_is_a_backend_error_naming_the_file(tiny_checkpoint, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(tiny_checkpoint, bad)
    weights = bad / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100_000])

    async def main():
        async with backend.create(run_config(bad)):
            pass

    with pytest.raises(
        BackendError, match=r"model.safetensors cannot be read \(.*\); write or download it again"
    ):
        asyncio.run(main())

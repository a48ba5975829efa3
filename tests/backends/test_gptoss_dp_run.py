"""run_mlperf.py --backend gptoss --data-parallel-size 2 and gptoss.serve --data-parallel-size 2 on two
CPU replicas: the single engine's tokens, each query once; a replica killed mid-run gives counted,
named failures and exit 1 within a time limit; no replica process outlives its run."""

from __future__ import annotations

import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.backends.httpkit import ROOT, accuracy_tokens, collect, make_backend, run_mlperf, start_process
from tests.gptoss.dpkit import gone

pytestmark = pytest.mark.timeout(400)

EXIT_FAILED_QUERIES = EXIT_ACCURACY_FAILED = 1
READY = re.compile(r"^gptoss: replica (\d) on cpu \(pid (\d+)\) ready in ")
ENGINE = ["--backend", "gptoss", "--dtype", "float32", "--kv-cache-tokens", "2048", "--max-num-seqs", "4"]
ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # both runs compute alike: the replicas run one torch thread each


def replica_pids(stderr: str) -> list[int]:
    """The replicas' pids, in replica order, from their ready lines."""
    found = dict(m.groups() for line in stderr.splitlines() if (m := READY.match(line)))
    return [int(found[i]) for i in sorted(found)]


def make_data(path: Path, rows: int, output_len: tuple[int, int], seed: int) -> Path:
    from data.synthetic import make

    make(rows, prompt_len=(110, 140), output_len=output_len, seed=seed).to_parquet(path)
    return path


def test_two_replicas_log_the_tokens_of_one(tiny_checkpoint, tmp_path, monkeypatch):
    data = make_data(tmp_path / "d.parquet", 8, (8, 24), seed=5)
    greedy = tmp_path / "greedy.json"
    greedy.write_text(json.dumps({"temperature": 0.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 64}))
    for k, v in ONE_THREAD.items():
        monkeypatch.setenv(k, v)
    runs = {}
    for name, flags in [
        ("one", ["--device", "cpu"]),
        ("two", ["--devices", "cpu,cpu"]),
        ("own process", ["--device", "cpu", "--engine-process"]),
    ]:
        out = tmp_path / name
        proc = run_mlperf(*ENGINE, *flags, "--model-path", tiny_checkpoint, "--input-file", data,
                          "--generation-config", greedy, "--accuracy", "--output-dir", out)  # fmt: skip
        # Random weights answer nothing right: every query succeeds and accuracy FAILs (exit 1).
        assert proc.returncode == EXIT_ACCURACY_FAILED, proc.stdout[-3000:] + proc.stderr[-3000:]
        record = json.loads((out / "offline" / "accuracy" / "run.json").read_text())
        assert record["failures"]["count"] == 0 and record["queries"]["completed"] == 8
        runs[name] = (accuracy_tokens(out / "offline" / "accuracy"), record, replica_pids(proc.stderr))
    (one, _, none), (two, record, pids), (own, _, own_pid) = runs["one"], runs["two"], runs["own process"]
    assert none == [] and len(pids) == 2 and gone(pids, within=0.0)
    assert sorted(two) == list(range(8)) and two == one  # each query once, with the one engine's tokens
    assert len(own_pid) == 1 and gone(own_pid, within=0.0) and own == one  # --engine-process: same tokens
    backend = record["backend"]
    assert backend["data_parallel_size"] == 2 and backend["device"] == "cpu,cpu"
    assert [r["pid"] for r in backend["replicas"]] == pids


def test_a_replica_killed_mid_run_is_counted_and_the_run_exits_1(tiny_checkpoint, tmp_path):
    # 850 output tokens a query (2 a replica: 2 x ~990 tokens fit its 2048-token cache). Replica 1 is
    # stopped (SIGSTOP) before the run starts, so its two queries cannot finish before the kill below
    # however fast or slow the machine is: timing alone twice let the run end first on a loaded CI.
    data = make_data(tmp_path / "d.parquet", 4, (850, 850), seed=6)
    out = tmp_path / "out"
    args = [*ENGINE, "--devices", "cpu,cpu", "--model-path", tiny_checkpoint, "--input-file", data,
            "--min-duration", "0", "--min-query-count", "4", "--output-dir", out]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "run_mlperf.py", *map(str, args)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        pids = wait_ready(proc, timeout=120)
        victim = psutil.Process(pids[1])
        victim.send_signal(signal.SIGSTOP)
        run_json = out / "offline" / "performance" / "run.json"
        deadline = time.monotonic() + 60
        while (status := run_status(run_json)) != "running":
            assert status in (None, "starting"), f"the run ended ({status}) with replica 1 stopped"
            assert time.monotonic() < deadline, "the run never started"
            time.sleep(0.05)
        # Offline issues all 4 queries at once, and the engine assigns them (2 a replica, least
        # tokens first) in the same loop turn: once replica 0 computes, replica 1 owns its two.
        start = busy(pids[0])
        while busy(pids[0]) < start + 0.3:
            assert time.monotonic() < deadline, "replica 0 never got work"
            time.sleep(0.02)
        victim.send_signal(signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=120)  # no hang: the time limit of the whole test
    finally:
        proc.kill()
    assert proc.returncode == EXIT_FAILED_QUERIES, stdout[-3000:] + stderr[-3000:]
    record = json.loads(run_json.read_text())
    died = f"replica 1 on cpu (pid {pids[1]}) died: killed by SIGKILL (exit code -9)"
    reason = f"BackendError: ReplicaDiedError: {died}"
    assert record["failures"]["reasons"] == {reason: 2}  # its two queries; replica 0 finished its own
    assert record["queries"]["completed"] == 4 and record["failures"]["count"] == 2
    assert f"gptoss: {died}; its 2 requests in flight failed, 1 replicas go on" in stderr and gone(pids)


def run_status(run_json: Path) -> str | None:
    """run.json's status, None before the first write (it is written atomically)."""
    return json.loads(run_json.read_text())["status"] if run_json.exists() else None


def busy(pid: int) -> float:
    """CPU seconds the process has spent."""
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def wait_ready(proc: subprocess.Popen, timeout: float) -> list[int]:
    """The replicas' pids from their ready lines on stderr."""
    sel = selectors.DefaultSelector()
    sel.register(proc.stderr, selectors.EVENT_READ)
    pids: dict[int, int] = {}
    deadline = time.monotonic() + timeout
    while len(pids) < 2 and sel.select(timeout=max(0.0, deadline - time.monotonic())):
        line = proc.stderr.readline()
        assert line, f"run_mlperf.py exited before its replicas were ready: {proc.communicate()}"
        if m := READY.match(line):
            pids[int(m.group(1))] = int(m.group(2))
    sel.close()
    assert len(pids) == 2, "the replicas did not get ready in time"
    return [pids[0], pids[1]]


def test_serve_fronts_two_replicas_and_stops_them(tiny_checkpoint, tmp_path):
    import asyncio

    from harness.config import SamplingParams
    from tests.backends.httpkit import engine_greedy

    prompts = [list(range(1000, 1000 + n)) for n in (3, 17, 40, 9)]
    args = [sys.executable, "-m", "gptoss.serve", "--model-path", str(tiny_checkpoint), "--port", "0",
            "--devices", "cpu,cpu", "--dtype", "float32", "--kv-cache-tokens", "2048"]  # fmt: skip
    proc, line = start_process(args, "gptoss.serve: listening on ", timeout=240)
    try:
        assert line.endswith("2 replicas)")
        url = line.split()[0]

        async def main():
            async with make_backend("sglang", [url], ready_timeout_s=30) as b:
                params = SamplingParams(max_new_tokens=12, temperature=0.0)
                return await asyncio.gather(*(collect(b, p, params) for p in prompts))

        got = asyncio.run(asyncio.wait_for(main(), 120))
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    want = engine_greedy(tiny_checkpoint, prompts)
    assert got == [(want[tuple(p)], None) for p in prompts]
    assert proc.returncode == 0 and "gptoss.serve: stopped" in stdout
    pids = replica_pids(stderr)
    assert len(pids) == 2 and gone(pids, within=0.0)


def test_a_replica_that_cannot_start_is_one_error_line_and_exit_2(tiny_checkpoint, tmp_path):
    data = make_data(tmp_path / "d.parquet", 2, (4, 4), seed=7)
    proc = run_mlperf("--backend", "gptoss", "--devices", "cpu,cpu", "--kv-cache-tokens", "256",
                      "--max-model-len", "1024", "--model-path", tiny_checkpoint, "--input-file", data,
                      "--output-dir", tmp_path / "out", timeout=120)  # fmt: skip
    text = proc.stdout + proc.stderr
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in text, text[-3000:]
    assert re.fullmatch(
        rf"error: gptoss engine could not start on {re.escape(str(tiny_checkpoint))}: replica [01] on cpu "
        r"\(pid \d+\) failed to start: ValueError: the KV cache holds 128 tokens"
        r" \(256 slots, with a sequence's last 128 for the sliding layers\), fewer than max_model_len "
        r"1024: raise --kv-cache-tokens or lower --max-model-len( \(1 other replica\(s\) failed too\))?",
        errors[0],
    ), errors[0]

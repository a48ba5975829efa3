"""Helpers of the HTTP backend and gptoss.serve tests: server processes, clients, the greedy oracle."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from harness.config import RunConfig, SamplingParams

ROOT = Path(__file__).resolve().parents[2]
FAULT_SERVER = Path(__file__).with_name("fault_server.py")

PROMPTS = [[200006, 17360, 200008, 13225, 2375], list(range(1000, 1040)), [7] * 3]
ORACLE_MAX_NEW = 12  # greedy decoding is prefix-stable: shorter requests compare against a prefix


def start_process(
    args: list[str], ready_prefix: str, timeout: float = 60.0, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen, str]:
    """Start a server process and return it with the rest of its first stdout line starting with prefix."""
    import selectors
    import time

    proc = subprocess.Popen(
        args,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
            break
        line = proc.stdout.readline()
        if not line:  # exited
            break
        if line.startswith(ready_prefix):
            sel.close()
            return proc, line[len(ready_prefix) :].strip()
    sel.close()
    proc.kill()
    out, err = proc.communicate(timeout=10)
    raise RuntimeError(f"{args} did not print {ready_prefix!r} (rc={proc.returncode}):\n{out}\n{err[-4000:]}")


def stop_process(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.communicate(timeout=10)


def run_mlperf(*args, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "run_mlperf.py", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def accuracy_tokens(log_dir: Path) -> dict[int, list[int]]:
    import numpy as np

    entries = json.loads((log_dir / "mlperf_log_accuracy.json").read_text())
    out = {e["qsl_idx"]: np.frombuffer(bytes.fromhex(e["data"]), dtype="<i4").tolist() for e in entries}
    assert len(out) == len(entries), "a query was logged twice"
    return out


def summary_result(log_dir: Path) -> str:
    for line in (log_dir / "mlperf_log_summary.txt").read_text().splitlines():
        if line.startswith("Result is"):
            return line.split(":", 1)[1].strip()
    raise AssertionError("no result in the summary")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_backend(
    name: str, urls: list[str], *, max_concurrency: int | None = None, timeout_s: float | None = None, **opts
):
    from backends import backend_class, module

    opts.setdefault("ready_timeout_s", 5.0)
    cfg = RunConfig(
        backend=name,
        scenario="offline",
        input_file=None,
        output_dir=Path("unused"),
        sampling=SamplingParams(max_new_tokens=8),
        server_urls=tuple(urls),
        max_concurrency=max_concurrency,
        timeout_s=timeout_s,
        backend_options=backend_class(name).Options(**opts),
    )
    return module(name).create(cfg)


async def collect(
    backend, prompt: list[int], params: SamplingParams
) -> tuple[list[int], BaseException | None]:
    """All ids the backend yielded, and the exception that ended the stream (None when it finished)."""
    got: list[int] = []
    try:
        async for ids in backend.stream(prompt, params):
            assert ids, "a backend must never yield an empty list"
            got += ids
    except Exception as e:  # noqa: BLE001 - returned to the test, which asserts on it
        return got, e
    return got, None


# ----------------------------------------------------------------------------- the real engine


def engine_greedy(
    ckpt: Path, prompts: list[list[int]], max_new: int = ORACLE_MAX_NEW
) -> dict[tuple, list[int]]:
    """The in-process engine's greedy tokens, one prompt at a time, in float32 (the oracle)."""
    import asyncio

    from gptoss.async_engine import AsyncEngine
    from gptoss.engine import EngineConfig
    from gptoss.sampling import SamplingParams as EngineSamplingParams

    params = EngineSamplingParams(max_new_tokens=max_new, temperature=0.0)

    async def main():
        out = {}
        async with AsyncEngine(EngineConfig(model_path=ckpt, dtype="float32")) as engine:
            for prompt in prompts:
                ids: list[int] = []
                async for d in engine.generate(prompt, params):
                    ids += d.token_ids
                out[tuple(prompt)] = ids
        return out

    return asyncio.run(main())


async def get_json(base: str, path: str):
    """GET base + path from a test server (the fault server's /times, /count ...) as JSON."""
    import aiohttp

    async with aiohttp.ClientSession() as s, s.get(f"{base}{path}") as r:
        return await r.json()


# The fault-server tests' one request: N tokens from the sglang or the openai client.
N = 8
PARAMS = SamplingParams(max_new_tokens=N)
BOTH = ["sglang", "openai"]


async def run_one(name: str, url: str, params: SamplingParams = PARAMS, **opts):
    async with make_backend(name, [url], **opts) as backend:
        return await collect(backend, [1, 2, 3], params)

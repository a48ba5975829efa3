"""Fixtures for the HTTP backend tests: real server processes on 127.0.0.1."""

from __future__ import annotations

import sys

import pytest
from httpkit import FAULT_SERVER, PROMPTS, engine_greedy, lmeval_prompts, start_process, stop_process


@pytest.fixture(scope="session")
def fault_url():
    proc, port = start_process([sys.executable, str(FAULT_SERVER)], "PORT ")
    yield f"http://127.0.0.1:{port}"
    stop_process(proc)


@pytest.fixture(scope="session")
def fault_url_incremental():
    proc, port = start_process([sys.executable, str(FAULT_SERVER), "--incremental"], "PORT ")
    yield f"http://127.0.0.1:{port}"
    stop_process(proc)


# ----------------------------------------------------------------------------- the real engine


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    from gptoss.tools.make_checkpoint import preset_config, write_checkpoint

    return write_checkpoint(preset_config("tiny"), tmp_path_factory.mktemp("gptoss") / "tiny", seed=0)


@pytest.fixture(scope="session")
def oracle(tiny_ckpt) -> dict[tuple, list[int]]:
    return engine_greedy(tiny_ckpt, PROMPTS + lmeval_prompts())


@pytest.fixture(scope="session")
def gptoss_server(tiny_ckpt):
    proc, line = start_process(
        [
            sys.executable,
            "-m",
            "gptoss.serve",
            "--model-path",
            str(tiny_ckpt),
            "--port",
            "0",
            "--dtype",
            "float32",
        ],
        "gptoss.serve: listening on ",
        timeout=240,
    )
    yield line.split()[0]
    stop_process(proc)

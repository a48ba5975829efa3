"""Fixtures of the backend tests: the fault-injection server as a real process on 127.0.0.1."""

from __future__ import annotations

import sys

import pytest

from tests.backends.httpkit import FAULT_SERVER, start_process, stop_process


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

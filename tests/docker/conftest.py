"""Fixtures for the docker tests; the helpers are in docker_fakes.py."""

from pathlib import Path

import pytest

from tests.docker.docker_fakes import FakeDocker


@pytest.fixture
def fake_docker(tmp_path: Path) -> FakeDocker:
    return FakeDocker(tmp_path)

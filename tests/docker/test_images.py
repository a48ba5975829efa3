"""The Dockerfiles agree with setup.sh, pyproject.toml and each other: pins, labels, user, install path."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from tests.docker.docker_fakes import REPO

BACKENDS = ("gptoss", "vllm", "sglang")
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def dockerfile(backend: str) -> str:
    return (REPO / "docker" / f"Dockerfile.{backend}").read_text()


def base_image(backend: str) -> tuple[str, str, str]:
    m = re.search(
        r"^ARG BASE_IMAGE=([^\s:@]+):([^\s@]+)@sha256:([0-9a-f]{64})$", dockerfile(backend), re.MULTILINE
    )
    assert m, f"Dockerfile.{backend}: the default BASE_IMAGE must be repository:tag@sha256:<64 hex>"
    return m.group(1), m.group(2), m.group(3)


def expected_pins(backend: str) -> dict[str, str]:
    m = re.search(r'^ARG EXPECT="([^"]*)"$', dockerfile(backend), re.MULTILINE)
    assert m, f"Dockerfile.{backend} has no ARG EXPECT"
    return dict(item.split("==") for item in m.group(1).split())


def setup_sh_value(name: str) -> str:
    m = re.search(rf'^{name}="([^"]+)"$', (REPO / "setup.sh").read_text(), re.MULTILINE)
    assert m, name
    return m.group(1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_image_installs_through_setup_sh_as_a_non_root_user_with_labels(backend):
    text = dockerfile(backend)
    assert text.count("FROM ${BASE_IMAGE}") == 1 and text.count("\nFROM ") == 1
    assert (
        f'RUN bash /opt/gptoss-mlperf/docker/install.sh {backend} "${{PROJECT_VERSION}}" "${{EXPECT}}"'
        in text
    )
    assert f"ENV MLPERF_BACKEND={backend} HOME=/home/mlperf USER=mlperf " in text
    assert re.findall(r"^USER (.+)$", text, re.MULTILINE) == ["10001:10001"]
    assert 'org.opencontainers.image.version="${PROJECT_VERSION}"' in text
    assert 'org.opencontainers.image.revision="${VCS_REF}"' in text
    assert f'org.opencontainers.image.title="gptoss-mlperf-{backend}"' in text


def test_install_sh_creates_the_user_the_dockerfiles_name():
    text = (REPO / "docker" / "install.sh").read_text()
    assert "groupadd --gid 10001 mlperf" in text
    assert "useradd --uid 10001 --gid 10001 " in text
    assert 'bash ./setup.sh --backend "$backend" --no-venv --cuda' in text


def test_vllm_image_is_the_version_setup_sh_installs_on_gpu_hosts():
    vllm = setup_sh_value("VLLM_CUDA_VERSION")
    assert base_image("vllm")[:2] == ("vllm/vllm-openai", f"v{vllm}")
    assert expected_pins("vllm")["vllm"] == vllm


def test_sglang_image_tag_and_expected_version_agree():
    repo, tag, _ = base_image("sglang")
    assert repo == "lmsysorg/sglang"
    assert tag == "v" + expected_pins("sglang")["sglang"]


def test_gptoss_image_torch_is_the_one_in_its_tag_and_allowed_by_pyproject():
    repo, tag, _ = base_image("gptoss")
    torch = expected_pins("gptoss")["torch"]
    assert repo == "pytorch/pytorch" and tag.startswith(f"{torch}-cuda") and tag.endswith("-runtime")
    torch_spec = next(
        d for d in PYPROJECT["project"]["optional-dependencies"]["gptoss"] if d.startswith("torch")
    )
    assert torch in SpecifierSet(torch_spec.removeprefix("torch"))
    assert "triton" in expected_pins("gptoss")


def test_the_build_context_leaves_local_state_out():
    ignored = (REPO / ".dockerignore").read_text().split()
    for entry in (".git", ".venv", "output", "**/*.safetensors"):
        assert entry in ignored


@pytest.fixture
def install_copy(tmp_path: Path) -> Path:
    (tmp_path / "docker").mkdir()
    shutil.copy(REPO / "docker" / "install.sh", tmp_path / "docker" / "install.sh")
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


@pytest.mark.parametrize(
    "version, message",
    [
        ("", ("install.sh: the PROJECT_VERSION build arg is missing; build with ./launch_docker.sh, "
              "or pass --build-arg PROJECT_VERSION={declared}")),
        ("9.9.9", 'install.sh: PROJECT_VERSION=9.9.9, but pyproject.toml says version = "{declared}"'),
    ],
)  # fmt: skip
def test_install_sh_refuses_a_wrong_project_version_before_installing(install_copy, version, message):
    proc = subprocess.run(
        ["bash", str(install_copy / "docker" / "install.sh"), "vllm", version],
        check=False, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    declared = PYPROJECT["project"]["version"]
    assert (proc.returncode, proc.stderr.strip()) == (1, message.format(declared=declared))

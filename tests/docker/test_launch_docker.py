"""launch_docker.sh against a fake docker: the exact build and run commands, and when it builds."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.docker.docker_fakes import NO_ENGINE, REPO, FakeDocker, tools_without_docker

VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
UID_GID = f"{os.getuid()}:{os.getgid()}"
INFO = ["info", "--format", "{{.ServerVersion}}"]
ULIMITS = ["--ulimit", "memlock=-1", "--ulimit", "stack=67108864", "--ulimit", "nofile=1048576:1048576"]
# The compilers' caches under the --compile-cache mount (a --rm container keeps nothing of its own)
COMPILE_ENV = [
    "-e", "XDG_CACHE_HOME=/cache/compile", "-e", "TRITON_CACHE_DIR=/cache/compile/triton",
    "-e", "TORCHINDUCTOR_CACHE_DIR=/cache/compile/torchinductor",
    "-e", "FLASHINFER_WORKSPACE_BASE=/cache/compile", "-e", "CUDA_CACHE_PATH=/cache/compile/nv",
]  # fmt: skip


def compile_mount(path: Path) -> list[str]:
    return ["-v", f"{path}:/cache/compile"]


def vcs_ref() -> str:
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], check=False, capture_output=True, text=True
    )
    if head.returncode != 0:
        return "unknown"
    status = subprocess.run(
        ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        check=True,
    )
    return head.stdout.strip() + ("-dirty" if status.stdout.strip() else "")


def image(backend: str) -> str:
    return f"gptoss-mlperf-{backend}:{VERSION}"


def inspect(tag: str) -> list[str]:
    return [
        "image",
        "inspect",
        "--format",
        '{{index .Config.Labels "org.opencontainers.image.revision"}}',
        tag,
    ]


def build(backend: str, tag: str | None = None, *extra: str) -> list[str]:
    return [
        "build",
        "--file", f"{REPO}/docker/Dockerfile.{backend}",
        "--tag", tag or image(backend),
        "--build-arg", f"PROJECT_VERSION={VERSION}",
        "--build-arg", f"VCS_REF={vcs_ref()}",
        *extra,
        str(REPO),
    ]  # fmt: skip


@pytest.fixture
def dirs(tmp_path: Path) -> dict[str, Path]:
    root = tmp_path.resolve()
    return {name: root / name for name in ("out", "hf", "models", "data", "cc")}


@pytest.mark.parametrize("backend", ["gptoss", "vllm", "sglang"])
def test_first_launch_builds_and_runs_the_second_only_runs(fake_docker: FakeDocker, dirs, backend):
    out, hf = dirs["out"], dirs["hf"]
    args = [
        "--backend",
        backend,
        "--output-dir",
        str(out),
        "--hf-cache",
        str(hf),
        "--",
        "--scenario",
        "offline",
    ]
    cc = fake_docker.home / ".cache" / "gptoss-mlperf" / "compile"  # the default
    run = [
        "run", "--rm", "--init", "-i", "--gpus", "all", "--ipc=host", *ULIMITS, "--user", UID_GID,
        "-v", f"{out}:/output", "-v", f"{hf}:/cache/huggingface", *compile_mount(cc),
        "-e", f"MLPERF_BACKEND={backend}", "-e", "HF_HOME=/cache/huggingface", *COMPILE_ENV,
        image(backend), "python3", "run_mlperf.py", "--backend", backend, "--output-dir", "/output",
        "--scenario", "offline",
    ]  # fmt: skip

    first = fake_docker.launch(*args)
    assert first.returncode == 0, first.stderr
    assert first.calls == [INFO, inspect(image(backend)), build(backend), run]
    assert f"launch_docker.sh: building {image(backend)} (docker/Dockerfile.{backend})" in first.stderr
    assert fake_docker.images == {image(backend): vcs_ref()}
    assert out.is_dir() and hf.is_dir() and cc.is_dir()  # made by the caller, not by the root-owned daemon

    second = fake_docker.launch(*args)
    assert second.returncode == 0, second.stderr
    assert second.calls == [INFO, inspect(image(backend)), run]
    assert "building" not in second.stderr and "note:" not in second.stderr


def test_mounts_gpus_env_and_passthrough_arguments(fake_docker: FakeDocker, dirs):
    for d in dirs.values():
        d.mkdir()
    fake_docker.set(images={image("vllm"): vcs_ref()})
    r = fake_docker.launch(
        "--backend", "vllm", "--model-dir", str(dirs["models"]), "--data-dir", str(dirs["data"]),
        "--output-dir", str(dirs["out"]), "--hf-cache", str(dirs["hf"]), "--gpus", '"device=0,1"',
        "--compile-cache", str(dirs["cc"]), "--network=host",
        "-e", "VLLM_USE_FLASHINFER_SAMPLER=0", "--env=NOTE=a b",
        "--scenario", "server",  # not ours: passes through
        "--", "--input-file", "/data/perf.parquet", "--rebuild",  # after --: passes through
        HF_TOKEN="hf_secret_value",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.calls == [
        INFO,
        inspect(image("vllm")),
        [
            "run", "--rm", "--init", "-i", "--gpus", '"device=0,1"', "--ipc=host", *ULIMITS,
            "--user", UID_GID, "--network", "host",
            "-v", f"{dirs['out']}:/output", "-v", f"{dirs['hf']}:/cache/huggingface",
            *compile_mount(dirs["cc"]),
            "-v", f"{dirs['models']}:/models:ro", "-v", f"{dirs['data']}:/data:ro",
            "-e", "MLPERF_BACKEND=vllm", "-e", "HF_HOME=/cache/huggingface", *COMPILE_ENV, "-e", "HF_TOKEN",
            "-e", "VLLM_USE_FLASHINFER_SAMPLER=0", "-e", "NOTE=a b",
            image("vllm"), "python3", "run_mlperf.py", "--backend", "vllm", "--output-dir", "/output",
            "--model-path", "/models", "--scenario", "server",
            "--input-file", "/data/perf.parquet", "--rebuild",
        ],
    ]  # fmt: skip
    assert "hf_secret_value" not in r.stderr + r.stdout  # the token goes by name only


def test_environment_variables_configure_it_and_flags_win(fake_docker: FakeDocker, dirs):
    for d in dirs.values():
        d.mkdir()
    env = {
        "MLPERF_BACKEND": "sglang",
        "MLPERF_MODEL_DIR": str(dirs["models"]),
        "MLPERF_DATA_DIR": str(dirs["data"]),
        "MLPERF_OUTPUT_DIR": str(dirs["out"]),
        "MLPERF_HF_CACHE": str(dirs["hf"]),
        "MLPERF_COMPILE_CACHE": "none",  # no mount, no cache variables
        "MLPERF_GPUS": "none",
        "MLPERF_DOCKER_NETWORK": "host",
        "MLPERF_IMAGE": "registry.example/mlperf:sg",
        "MLPERF_BASE_IMAGE": "lmsysorg/sglang:v0.5.16-cu130-runtime",
    }
    r = fake_docker.launch("--", "--scenario", "interactive", **env)
    assert r.returncode == 0, r.stderr
    tag = "registry.example/mlperf:sg"
    assert r.calls == [
        INFO,
        inspect(tag),
        build("sglang", tag, "--build-arg", "BASE_IMAGE=lmsysorg/sglang:v0.5.16-cu130-runtime"),
        [
            "run", "--rm", "--init", "-i", "--ipc=host", *ULIMITS, "--user", UID_GID, "--network", "host",
            "-v", f"{dirs['out']}:/output", "-v", f"{dirs['hf']}:/cache/huggingface",
            "-v", f"{dirs['models']}:/models:ro", "-v", f"{dirs['data']}:/data:ro",
            "-e", "MLPERF_BACKEND=sglang", "-e", "HF_HOME=/cache/huggingface",
            tag, "python3", "run_mlperf.py", "--backend", "sglang", "--output-dir", "/output",
            "--model-path", "/models", "--scenario", "interactive",
        ],
    ]  # fmt: skip

    flags = fake_docker.launch(
        "--backend", "gptoss", "--gpus", "all", "--image", "mine:1", "--compile-cache=" + str(dirs["cc"]),
        "--", "-h", **env,
    )  # fmt: skip
    assert flags.returncode == 0, flags.stderr
    assert flags.calls[-1] == [
        "run", "--rm", "--init", "-i", "--gpus", "all", "--ipc=host", *ULIMITS, "--user", UID_GID,
        "--network", "host",
        "-v", f"{dirs['out']}:/output", "-v", f"{dirs['hf']}:/cache/huggingface", *compile_mount(dirs["cc"]),
        "-v", f"{dirs['models']}:/models:ro", "-v", f"{dirs['data']}:/data:ro",
        "-e", "MLPERF_BACKEND=gptoss", "-e", "HF_HOME=/cache/huggingface", *COMPILE_ENV,
        "mine:1", "python3", "run_mlperf.py", "--backend", "gptoss", "--output-dir", "/output",
        "--model-path", "/models", "-h",
    ]  # fmt: skip
    assert flags.calls[2][:5] == ["build", "--file", f"{REPO}/docker/Dockerfile.gptoss", "--tag", "mine:1"]


def test_defaults_hf_home_and_a_shell_without_arguments(fake_docker: FakeDocker, dirs):
    fake_docker.set(images={image("gptoss"): vcs_ref()})
    r = fake_docker.launch(
        "--output-dir", str(dirs["out"]), HF_HOME=str(dirs["hf"]), XDG_CACHE_HOME=str(dirs["cc"])
    )
    assert r.returncode == 0, r.stderr
    assert r.calls[-1] == [
        "run", "--rm", "--init", "-i", "--gpus", "all", "--ipc=host", *ULIMITS, "--user", UID_GID,
        "-v", f"{dirs['out']}:/output", "-v", f"{dirs['hf']}:/cache/huggingface",
        *compile_mount(dirs["cc"] / "gptoss-mlperf" / "compile"),  # under XDG_CACHE_HOME
        "-e", "MLPERF_BACKEND=gptoss", "-e", "HF_HOME=/cache/huggingface", *COMPILE_ENV,
        image("gptoss"), "bash",
    ]  # fmt: skip

    # Neither MLPERF_HF_CACHE nor HF_HOME: huggingface_hub's own default under $HOME.
    r = fake_docker.launch("--output-dir", str(dirs["out"]))
    assert f"{fake_docker.home}/.cache/huggingface:/cache/huggingface" in r.calls[-1]
    assert (fake_docker.home / ".cache" / "huggingface").is_dir()


def test_rebuild_builds_even_when_the_image_exists(fake_docker: FakeDocker, dirs):
    fake_docker.set(images={image("vllm"): "0000000"})
    r = fake_docker.launch("--backend", "vllm", "--rebuild", "--output-dir", str(dirs["out"]))
    assert r.returncode == 0, r.stderr
    assert [c[0] for c in r.calls] == ["info", "build", "run"]
    assert r.calls[1] == build("vllm")
    assert fake_docker.images == {image("vllm"): vcs_ref()}


def test_an_image_from_another_revision_is_reused_with_a_note(fake_docker: FakeDocker, dirs):
    fake_docker.set(images={image("sglang"): "0123abc"})
    r = fake_docker.launch("--backend", "sglang", "--output-dir", str(dirs["out"]))
    assert r.returncode == 0, r.stderr
    assert [c[0] for c in r.calls] == ["info", "image", "run"]
    assert (
        f"launch_docker.sh: note: {image('sglang')} was built from 0123abc, this checkout is {vcs_ref()};"
        " --rebuild brings the image up to date, --mount-source runs this checkout's code in it"
    ) in r.stderr

    mounted = fake_docker.launch("--backend", "sglang", "--output-dir", str(dirs["out"]), "--mount-source")
    assert "note:" not in mounted.stderr
    run = mounted.calls[-1]
    assert run[run.index(f"{REPO}:/opt/gptoss-mlperf") - 1] == "-v"


def test_dry_run_prints_the_exact_commands_and_runs_nothing(fake_docker: FakeDocker, dirs):
    args = ["--backend", "vllm", "--output-dir", str(dirs["out"]), "--", "--scenario", "offline"]
    run = [
        "docker", "run", "--rm", "--init", "-i", "--gpus", "all", "--ipc=host", *ULIMITS, "--user", UID_GID,
        "-v", f"{dirs['out']}:/output", "-v", f"{fake_docker.home}/.cache/huggingface:/cache/huggingface",
        *compile_mount(fake_docker.home / ".cache" / "gptoss-mlperf" / "compile"),
        "-e", "MLPERF_BACKEND=vllm", "-e", "HF_HOME=/cache/huggingface", *COMPILE_ENV,
        image("vllm"), "python3", "run_mlperf.py", "--backend", "vllm", "--output-dir", "/output",
        "--scenario", "offline",
    ]  # fmt: skip

    missing = fake_docker.launch("--dry-run", *args)
    assert missing.returncode == 0, missing.stderr
    assert [shlex.split(line) for line in missing.stdout.splitlines()] == [["docker", *build("vllm")], run]
    assert missing.calls == [INFO, inspect(image("vllm"))]  # queries only: no build, no run
    assert not dirs["out"].exists() and not (fake_docker.home / ".cache").exists()

    fake_docker.set(images={image("vllm"): vcs_ref()})
    present = fake_docker.launch("--dry-run", *args)
    assert present.stdout.splitlines()[0] == f"# {image('vllm')} exists: no build (--rebuild forces one)"
    assert shlex.split(present.stdout.splitlines()[1]) == run
    assert present.calls == [INFO, inspect(image("vllm"))]


def test_dry_run_without_an_engine_still_prints_both_commands(fake_docker: FakeDocker, dirs):
    fake_docker.set(engine=False)
    r = fake_docker.launch("--dry-run", "--backend", "sglang", "--output-dir", str(dirs["out"]))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"# no Docker engine answers: {NO_ENGINE}"
    assert lines[1] == (
        f"# so whether {image('sglang')} exists is unknown:"
        " the build runs only if it is missing (or with --rebuild)"
    )
    assert shlex.split(lines[2]) == ["docker", *build("sglang")]
    assert shlex.split(lines[3])[:2] == ["docker", "run"] and lines[3].endswith(f"{image('sglang')} bash")
    assert r.calls == [INFO]


def test_no_engine_is_explained_and_exits_3(fake_docker: FakeDocker, dirs):
    fake_docker.set(engine=False)
    r = fake_docker.launch(
        "--backend", "vllm", "--output-dir", str(dirs["out"]), "--", "--scenario", "offline"
    )
    assert r.returncode == 3
    assert r.stderr.splitlines() == [
        f"launch_docker.sh: cannot build or run the vllm image: no Docker engine answers: {NO_ENGINE}",
        "  Start the engine (e.g. `sudo systemctl start docker`) or point DOCKER_HOST",
        '  (or `docker context use`) at one that runs; on "permission denied", join the docker group.',
        "  `./launch_docker.sh --dry-run ...` prints the docker commands without an engine.",
    ]
    assert r.calls == [INFO]
    assert not dirs["out"].exists()


def test_no_docker_cli_is_explained_and_exits_3(fake_docker: FakeDocker, dirs, tmp_path):
    r = fake_docker.launch("--output-dir", str(dirs["out"]), path=tools_without_docker(tmp_path / "tools"))
    assert r.returncode == 3
    assert r.stderr.splitlines()[0] == (
        "launch_docker.sh: cannot build or run the gptoss image: "
        "the docker CLI is not installed (see https://docs.docker.com/engine/install/)"
    )


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker CLI on this machine")
def test_the_real_docker_cli_without_an_engine(fake_docker: FakeDocker, dirs):
    """CI and these machines have the docker CLI but no engine: the real CLI's error gets through."""
    info = subprocess.run(
        ["docker", "info", "--format", "{{.ServerVersion}}"], check=False, capture_output=True, text=True
    )
    if info.returncode == 0:
        pytest.skip(f"a Docker engine {info.stdout.strip()} answers here")
    real_path = os.environ["PATH"]
    r = fake_docker.launch("--backend", "vllm", "--output-dir", str(dirs["out"]), path=real_path)
    assert r.returncode == 3
    assert r.stderr.startswith(
        "launch_docker.sh: cannot build or run the vllm image: "
        f"no Docker engine answers: {info.stderr.strip()}"
    )


def test_the_container_exit_status_is_the_launchers(fake_docker: FakeDocker, dirs):
    fake_docker.set(images={image("gptoss"): vcs_ref()}, run_rc=7)
    assert fake_docker.launch("--output-dir", str(dirs["out"]), "--", "--scenario", "offline").returncode == 7


def test_a_failed_build_stops_before_run(fake_docker: FakeDocker, dirs):
    fake_docker.set(build_rc=1)
    r = fake_docker.launch("--backend", "vllm", "--output-dir", str(dirs["out"]))
    assert r.returncode == 1
    assert [c[0] for c in r.calls] == ["info", "image", "build"]
    assert fake_docker.images == {}


OUTSIDE = (
    "run_mlperf.py --output-dir '/tmp/results' is outside the mounted /output, so the results would vanish"
    " with the container; give launch_docker.sh --output-dir HOST_DIR instead"
)
MISMATCH = (
    "run_mlperf.py --backend 'sglang' does not match the vllm image; give launch_docker.sh --backend instead"
)
OPENAI = (
    "the openai backend is an HTTP client with no image of its own: run it on the host"
    " (./setup.sh --backend openai), or use the sglang image"
)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--backend", "tensorrt"],
         "unknown backend 'tensorrt'; choose gptoss, vllm or sglang (--backend or MLPERF_BACKEND)"),
        (["--backend", "openai"], OPENAI),
        (["--model-dir", "/nonexistent/model"], "--model-dir '/nonexistent/model' is not a directory"),
        (["--data-dir", "/nonexistent/data"], "--data-dir '/nonexistent/data' is not a directory"),
        (["--output-dir", "/tmp/a:b"], "--output-dir '/tmp/a:b' contains ':', which docker -v cannot mount"),
        (["--compile-cache", "/tmp/c:d"],
         "--compile-cache '/tmp/c:d' contains ':', which docker -v cannot mount"),
        (["--gpus"], "--gpus needs a value"),
        (["-e", "NOVALUE"], "-e takes KEY=VALUE, got 'NOVALUE'"),
        (["--backend", "vllm", "--", "--backend", "sglang"], MISMATCH),
        (["--", "--output-dir=/tmp/results"], OUTSIDE),
    ],
)  # fmt: skip
def test_usage_errors_exit_2_before_any_docker_call(fake_docker: FakeDocker, args, message):
    r = fake_docker.launch(*args)
    assert (r.returncode, r.stderr.strip(), r.calls) == (2, f"launch_docker.sh: {message}", [])


def test_run_mlperf_flags_that_agree_with_the_mounts_pass(fake_docker: FakeDocker, dirs):
    fake_docker.set(images={image("vllm"): vcs_ref()})
    args = ["--backend", "vllm", "--output-dir", str(dirs["out"])]
    r = fake_docker.launch(*args, "--", "--backend=vllm", "--output-dir", "/output/run1")
    assert r.returncode == 0, r.stderr
    assert r.calls[-1][-8:] == [
        "run_mlperf.py", "--backend", "vllm", "--output-dir", "/output",
        "--backend=vllm", "--output-dir", "/output/run1",
    ]  # fmt: skip


def test_help_lists_every_option(fake_docker: FakeDocker):
    r = fake_docker.launch("--help")
    assert r.returncode == 0 and r.calls == []
    options = ["--backend", "--model-dir", "--data-dir", "--output-dir", "--hf-cache", "--compile-cache"]
    options += ["--gpus", "--network"]
    options += ["--env", "--image", "--base-image", "--rebuild", "--mount-source", "--dry-run"]
    for option in options:
        assert f"  {option}" in r.stdout or f", {option}" in r.stdout, option

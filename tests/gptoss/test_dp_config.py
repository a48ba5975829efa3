"""--data-parallel-size and --devices: one declaration (EngineConfig) read by run_mlperf.py --backend
gptoss and python -m gptoss.serve; the replicas' devices; bad combinations are one error line."""

from __future__ import annotations

import pytest

from gptoss.engine import EngineConfig
from harness.cli import parse_config


def gptoss_options(*flags: str) -> EngineConfig:
    return parse_config(["run_mlperf.py", "--backend", "gptoss", *flags]).backend_options


def test_the_flags_reach_engine_config_in_both_programs():
    from gptoss.serve.main import parse_args

    assert gptoss_options("--data-parallel-size", "2").data_parallel_size == 2
    assert gptoss_options("--devices", "cuda:0, cuda:1").devices == ("cuda:0", "cuda:1")
    assert EngineConfig().num_replicas == 1 and gptoss_options("--devices", "cpu,cpu,cpu").num_replicas == 3
    serve = parse_args(["--devices", "cpu,cpu", "--no-cuda-graphs"]).engine
    assert (serve.devices, serve.num_replicas, serve.cuda_graphs) == (("cpu", "cpu"), 2, False)
    assert parse_args(["--data-parallel-size", "4", "--device", "cuda"]).engine.num_replicas == 4


@pytest.mark.parametrize(
    "config, has_cuda, devices",
    [
        (EngineConfig(), True, ("cuda",)),
        (EngineConfig(data_parallel_size=2), True, ("cuda:0", "cuda:1")),
        (EngineConfig(data_parallel_size=2), False, ("cpu", "cpu")),
        (EngineConfig(data_parallel_size=3, device="cuda"), False, ("cuda:0", "cuda:1", "cuda:2")),
        (EngineConfig(devices=("cuda:3", "cuda:1")), True, ("cuda:3", "cuda:1")),
        (EngineConfig(device="cuda:1"), True, ("cuda:1",)),
    ],
)
def test_replica_devices(config, has_cuda, devices):
    assert config.replica_devices(has_cuda) == devices


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--data-parallel-size", "0"], "--data-parallel-size must be >= 1, got 0"),
        (
            ["--data-parallel-size", "2", "--device", "cuda:1"],
            "--data-parallel-size 2 with --device cuda:1: name each replica's GPU in --devices instead "
            "(e.g. cuda:0,cuda:1)",
        ),
        (["--devices", "cpu,cpu", "--device", "cpu"], "give --device or --devices, not both"),
        (
            ["--devices", "cpu,cpu", "--data-parallel-size", "3"],
            "--devices names 2 replicas but --data-parallel-size is 3",
        ),
        (["--devices", "cuda:0,tpu:1"], "--devices: 'tpu:1' is not cpu, cuda or cuda:N"),
        (["--devices", "cuda:0,"], "--devices: '' is not cpu, cuda or cuda:N"),
        (["--devices", "cuda,cuda"], "--devices: give each GPU's index (cuda:0,cuda:1 ...), not 'cuda'"),
        (["--devices", "cuda:0,cuda:0"], "--devices: each GPU may hold one replica, got cuda:0,cuda:0"),
    ],
)
def test_bad_combinations_are_one_error_line_naming_the_flags(flags, message, capsys):
    with pytest.raises(SystemExit) as e:
        gptoss_options(*flags)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1 and message in err, err

    from gptoss.serve.main import parse_args

    with pytest.raises(SystemExit):
        parse_args(flags)
    assert message in capsys.readouterr().err


def test_async_engine_refuses_a_config_of_several_replicas():
    from gptoss.async_engine import AsyncEngine

    with pytest.raises(ValueError, match="AsyncEngine runs one replica, the config asks for 2"):
        AsyncEngine(EngineConfig(data_parallel_size=2))


@pytest.mark.parametrize(
    "flags, has_cuda, own",
    [
        ((), True, True),  # on CUDA the engine gets its own process (no GIL shared with LoadGen)
        ((), False, False),  # on CPU it stays in process
        (("--device", "cpu"), True, False),
        (("--device", "cuda:1"), True, True),
        (("--no-engine-process",), True, False),
        (("--engine-process", "--device", "cpu"), False, True),
    ],
)
def test_a_single_engine_runs_in_its_own_process_on_cuda_unless_told(flags, has_cuda, own):
    assert gptoss_options(*flags).own_process(has_cuda) is own

"""--vllm-process server's command line: the inline path's engine options as vLLM api_server flags that its
own parser reads back to the same values."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from backends.vllm_args import DEFAULTS, VllmOptionError, VllmOptions, engine_kwargs
from backends.vllm_cli import server_flags, server_parser
from backends.vllm_server import server_command
from tests.backends.vllm.vllmkit import parse_flags

# Every named engine flag, switches both ways, plus --vllm-arg values of each kind vLLM parses.
EVERY_FLAG = [
    "--tensor-parallel-size",
    "2",
    "--data-parallel-size",
    "1",
    "--enable-expert-parallel",
    "--max-num-seqs",
    "8",
    "--max-num-batched-tokens",
    "2048",
    "--dtype",
    "bfloat16",
    "--max-model-len",
    "4096",
    "--gpu-memory-utilization",
    "0.85",
    "--kv-cache-dtype",
    "fp8",
    "--no-async-scheduling",
    "--no-enable-prefix-caching",
    "--compilation-config",
    '{"cudagraph_capture_sizes": [1, 2, 4]}',
    "--enforce-eager",
    "--lora-modules",
    "sql=/adapters/sql",
    "--vllm-arg",
    "max_lora_rank=64",
    "--vllm-arg",
    "cudagraph_capture_sizes=1 8 64",
    "--vllm-arg",
    "kv_cache_memory_bytes=2G",
    "--vllm-arg",
    "stream_interval=4",
]


def _read_back(argv: list[str]) -> dict:
    return vars(server_parser().parse_args(argv))


def test_engine_options_become_the_exact_server_flags():
    kwargs = engine_kwargs(Path("/models/gpt-oss-20b"), parse_flags(EVERY_FLAG), on_cpu=True)
    assert server_flags(kwargs) == [
        "--model",
        "/models/gpt-oss-20b",
        "--skip-tokenizer-init",
        "--disable-log-stats",
        "--tensor-parallel-size",
        "2",
        "--data-parallel-size",
        "1",
        "--enable-expert-parallel",
        "--max-num-seqs",
        "8",
        "--max-num-batched-tokens",
        "2048",
        "--dtype",
        "bfloat16",
        "--max-model-len",
        "4096",
        "--gpu-memory-utilization",
        "0.85",
        "--kv-cache-dtype",
        "fp8",
        "--no-async-scheduling",
        "--no-enable-prefix-caching",
        "--compilation-config",
        '{"cudagraph_capture_sizes": [1, 2, 4]}',
        "--enforce-eager",
        "--max-lora-rank",
        "64",
        "--cudagraph-capture-sizes",
        "1",
        "8",
        "64",
        "--kv-cache-memory-bytes",
        "2147483648",
        "--stream-interval",
        "4",
        "--enable-lora",
    ]


def test_the_whole_server_command(tmp_path):
    opts = parse_flags(["--max-num-seqs", "8", "--lora-modules", f"sql={tmp_path}"])
    kwargs = engine_kwargs(Path("/models/gpt-oss-20b"), opts, on_cpu=False)
    argv, model = server_command(kwargs, opts, 41234)
    assert argv == [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        *["--model", "/models/gpt-oss-20b", "--skip-tokenizer-init", "--disable-log-stats"],
        *["--max-num-seqs", "8", "--enable-lora", "--served-model-name", "gpt-oss-20b"],
        *["--generation-config", "vllm", "--host", "127.0.0.1", "--port", "41234"],
        *["--disable-uvicorn-access-log", "--lora-modules", f"sql={tmp_path}"],
    ]
    assert model == "sql"  # requests name the adapter
    back = _read_back(argv[3:])
    assert (back["port"], back["host"], back["served_model_name"]) == (41234, "127.0.0.1", ["gpt-oss-20b"])
    assert [(m.name, m.path) for m in back["lora_modules"]] == [("sql", str(tmp_path))]
    # The user's own served name wins, and requests use it.
    named = parse_flags(["--vllm-arg", "served_model_name=oss"])
    assert server_command(engine_kwargs(Path("/m"), named, on_cpu=False), named, 1)[1] == "oss"


@pytest.mark.parametrize("on_cpu", [True, False])
def test_vllms_own_parser_reads_every_option_back_unchanged(on_cpu):
    # On a GPU, eager mode with LoRA is refused (test_vllm_options): there the switch goes the other way.
    flags = (
        EVERY_FLAG if on_cpu else ["--no-enforce-eager" if f == "--enforce-eager" else f for f in EVERY_FLAG]
    )
    kwargs = engine_kwargs(Path("/m"), parse_flags(flags), on_cpu=on_cpu)
    # what engine_kwargs adds by itself, as well as every named engine flag, is in there
    named = {
        f
        for f in VllmOptions.__dataclass_fields__
        if VllmOptions.__dataclass_fields__[f].metadata.get("engine")
    }
    assert named | set(DEFAULTS) | {"model", "skip_tokenizer_init", "kv_cache_memory_bytes"} <= set(kwargs)
    back = _read_back(server_flags(kwargs))
    for key, value in kwargs.items():
        got = back[key]
        if key == "compilation_config":  # vLLM parses it into its CompilationConfig
            assert {k: getattr(got, k) for k in value} == value
        else:
            assert got == value, key


def test_switches_off_use_the_no_form_or_the_default():
    kwargs = {"enforce_eager": False, "enable_prefix_caching": False, "disable_log_stats": False}
    # --disable-log-stats has no --no- twin: off is its default, so it is left out
    assert server_flags(kwargs) == ["--no-enforce-eager", "--no-enable-prefix-caching"]
    assert _read_back(server_flags(kwargs))["disable_log_stats"] is False


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"warp_speed": 9},
            "warp_speed=9: cannot be passed to vLLM's server (vLLM's api_server has no flag --warp-speed)",
        ),
        (
            {"enforce_eager": "yes"},
            "enforce_eager='yes': cannot be passed to vLLM's server (--enforce-eager is a switch)",
        ),
        ({"max_num_seqs": None}, None),
        (
            {"dtype": None},
            "dtype=None: cannot be passed to vLLM's server (--dtype cannot be set back to None)",
        ),
        ({"max_num_seqs": object()}, "cannot be passed to vLLM's server (a object value)"),
    ],
)
def test_an_option_the_server_cannot_take_is_refused_by_name(kwargs, message):
    if message is None:
        assert server_flags(kwargs) == []  # None where vLLM's default is None: nothing to say
        return
    with pytest.raises(VllmOptionError) as e:
        server_flags(kwargs)
    assert message in str(e.value) and str(e.value).endswith("run it with --vllm-process inline")

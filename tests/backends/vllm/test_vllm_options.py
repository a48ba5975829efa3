"""vllm backend flags: parsing, what reaches AsyncEngineArgs, and clear errors before any engine starts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from backends import vllm as vllm_backend
from backends.vllm import VllmOptionError, VllmOptions, engine_kwargs
from harness.config import SamplingParams
from tests.backends.vllm.vllmkit import INLINE, REPO, parse_flags, run_config


def test_module_and_flags_work_without_importing_vllm():
    code = (
        "import sys\n"
        "from backends import vllm as b\n"
        "from harness.cli import build_parser\nfrom harness.options import parse_options\n"
        "o = parse_options(b.VllmOptions, ['--max-num-seqs', '8', '--vllm-arg', 'max_loras=2'])\n"
        "assert o.engine_args == {'max_num_seqs': 8}, o\n"
        "build_parser('vllm').format_help()\n"
        "heavy = sorted(m for m in ('vllm', 'torch') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)


def test_flags_become_options_with_only_what_was_set():
    opts = parse_flags(
        [
            "--tensor-parallel-size",
            "2",
            "--enable-expert-parallel",
            "--no-enable-prefix-caching",
            "--gpu-memory-utilization",
            "0.85",
            "--kv-cache-dtype",
            "fp8",
            "--compilation-config",
            '{"cudagraph_capture_sizes": [1, 2, 4]}',
            "--lora-modules",
            "sql=/adapters/sql",
            "--vllm-arg",
            "max_lora_rank=64",
            "--vllm-arg",
            "stream_interval=4",
        ]
    )
    assert opts == VllmOptions(
        tensor_parallel_size=2,
        enable_expert_parallel=True,
        gpu_memory_utilization=0.85,
        kv_cache_dtype="fp8",
        enable_prefix_caching=False,
        compilation_config={"cudagraph_capture_sizes": [1, 2, 4]},
        extra_args=(("max_lora_rank", "64"), ("stream_interval", "4")),
        lora=("sql", "/adapters/sql"),
        output_kind="auto",
    )
    assert list(opts.engine_args) == [
        "tensor_parallel_size",
        "enable_expert_parallel",
        "gpu_memory_utilization",
        "kv_cache_dtype",
        "enable_prefix_caching",
        "compilation_config",
    ]
    assert parse_flags([]) == VllmOptions() and VllmOptions().engine_args == {}


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--compilation-config", "{not json"], "--compilation-config: not valid JSON"),
        (["--compilation-config", "[1, 2]"], "--compilation-config: expected a JSON object"),
        (["--lora-modules", "just-a-path"], "--lora-modules: expected KEY=VALUE"),
        (["--vllm-arg", "=3"], "--vllm-arg: expected KEY=VALUE"),
        (["--max-num-seqs", "many"], "--max-num-seqs: expected an integer, got 'many'"),
        (["--vllm-output-kind", "sometimes"], "--vllm-output-kind: invalid choice: 'sometimes'"),
        (["--vllm-process", "thread"], "--vllm-process: invalid choice: 'thread'"),
        (["--vllm-start-timeout", "0"], "--vllm-start-timeout must be a number of seconds > 0, got 0.0"),
    ],
)
def test_malformed_flags_fail_at_parse_time(flags, message, capsys):
    with pytest.raises(SystemExit) as e:
        parse_flags(flags)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_engine_kwargs_hold_the_user_settings_plus_the_documented_defaults(tmp_path):
    opts = parse_flags(
        [
            "--max-num-seqs",
            "8",
            "--vllm-arg",
            "max_lora_rank=64",
            "--vllm-arg",
            "cudagraph_capture_sizes=1 2 4",
            "--vllm-arg",
            "disable_log_stats=false",
            "--vllm-arg",
            "enforce_eager=1",
        ]
    )
    kw = engine_kwargs(tmp_path, opts, on_cpu=False)
    assert kw == {
        "model": str(tmp_path),
        "skip_tokenizer_init": True,
        "disable_log_stats": False,
        "max_num_seqs": 8,
        "max_lora_rank": 64,
        "cudagraph_capture_sizes": [1, 2, 4],
        "enforce_eager": True,
    }
    # On CPU a fixed KV cache, unless the user sized memory in either of vLLM's two ways.
    assert engine_kwargs(tmp_path, VllmOptions(), on_cpu=True)["kv_cache_memory_bytes"] == 1 << 30
    assert "kv_cache_memory_bytes" not in engine_kwargs(
        tmp_path, parse_flags(["--gpu-memory-utilization", "0.3"]), on_cpu=True
    )
    assert (
        engine_kwargs(tmp_path, parse_flags(["--vllm-arg", "kv_cache_memory_bytes=2G"]), on_cpu=True)[
            "kv_cache_memory_bytes"
        ]
        == 2 << 30
    )
    # Server and Interactive: 2048 prompt tokens a step unless the user sets it; Offline: vLLM's default.
    latency = engine_kwargs(tmp_path, VllmOptions(), on_cpu=False, latency=True)
    assert latency["max_num_batched_tokens"] == 2048
    assert "max_num_batched_tokens" not in engine_kwargs(tmp_path, VllmOptions(), on_cpu=False)
    given = parse_flags(["--max-num-batched-tokens", "8192"])
    assert engine_kwargs(tmp_path, given, on_cpu=False, latency=True)["max_num_batched_tokens"] == 8192
    # --lora-modules implies --enable-lora; an explicit --no-enable-lora is left for vLLM to judge.
    assert (
        engine_kwargs(tmp_path, parse_flags(["--lora-modules", "a=/x"]), on_cpu=False)["enable_lora"] is True
    )


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--vllm-arg", "max_num_seq=4"],
            "--vllm-arg max_num_seq=4: vLLM's engine has no option 'max_num_seq'. Did you mean: max_num_seqs",
        ),
        (
            ["--vllm-arg", "warp_speed=9"],
            "--vllm-arg warp_speed=9: vLLM's engine has no option 'warp_speed'.",
        ),
        (
            ["--vllm-arg", "max_lora_rank=7"],
            "--vllm-arg max_lora_rank=7: vLLM rejected it: argument --max-lora-rank: invalid choice: 7",
        ),
        (
            ["--vllm-arg", "max_num_seqs=lots"],
            "--vllm-arg max_num_seqs=lots: vLLM rejected it: "
            "argument --max-num-seqs: invalid int value: 'lots'",
        ),
        (
            ["--vllm-arg", "enforce_eager=maybe"],
            "--vllm-arg enforce_eager=maybe: enforce_eager is a switch, give true or false",
        ),
        (["--vllm-arg", "model=/elsewhere"], "--vllm-arg model: not settable; model is --model-path"),
        (
            ["--max-num-seqs", "4", "--vllm-arg", "max-num-seqs=8"],
            "--vllm-arg max_num_seqs repeats --max-num-seqs; give it once",
        ),
    ],
)
def test_options_vllm_does_not_know_or_rejects_are_clear_errors(tmp_path, flags, message):
    with pytest.raises(VllmOptionError) as e:
        engine_kwargs(tmp_path, parse_flags(flags), on_cpu=True)
    assert str(e.value).startswith(message), str(e.value)


def test_eager_lora_on_a_gpu_is_refused_before_vllm_starts(tmp_path):
    """vLLM 0.26 kills its engine on the first LoRA step under enforce_eager (seen on an H100)."""
    flags = ["--lora-modules", f"a={tmp_path}", "--enforce-eager"]
    with pytest.raises(VllmOptionError, match="--enforce-eager with LoRA: vLLM 0.26 fails"):
        engine_kwargs(tmp_path, parse_flags(flags), on_cpu=False)
    with pytest.raises(VllmOptionError, match="drop --enforce-eager"):
        engine_kwargs(tmp_path, parse_flags(["--enable-lora", "--enforce-eager"]), on_cpu=False)
    assert engine_kwargs(tmp_path, parse_flags(flags[:2]), on_cpu=False)["enable_lora"] is True
    assert engine_kwargs(tmp_path, parse_flags(flags), on_cpu=True)["enforce_eager"] is True


def test_create_rejects_bad_values_before_starting_anything(checkpoints, tmp_path):
    with pytest.raises(
        VllmOptionError,
        match=r"(?s)vLLM rejected the engine options .*'kv_cache_dtype': 'fp5'"
        r".*cache_dtype.*Input should be 'auto'",
    ):
        vllm_backend.create(run_config(checkpoints["bf16"], ["--kv-cache-dtype", "fp5"]))
    with pytest.raises(
        VllmOptionError, match=r"vLLM rejected the engine options .*'max_model_len': 999999999"
    ):
        vllm_backend.create(run_config(checkpoints["bf16"], ["--max-model-len", "999999999"]))
    with pytest.raises(VllmOptionError, match="--backend vllm needs --model-path"):
        vllm_backend.create(run_config(None, []))
    with pytest.raises(VllmOptionError, match=f"--model-path {tmp_path}: no config.json there"):
        vllm_backend.create(run_config(tmp_path, []))
    with pytest.raises(VllmOptionError, match=f"--lora-modules x={tmp_path}/nope: no such folder"):
        vllm_backend.create(run_config(checkpoints["bf16"], ["--lora-modules", f"x={tmp_path}/nope"]))


def test_create_resolves_vllm_config_and_output_kind(checkpoints):
    offline = vllm_backend.create(
        run_config(checkpoints["bf16"], ["--max-model-len", "300", "--max-num-seqs", "5"], "offline")
    )
    assert (offline.max_model_len, offline.vocab_size, offline.final_only) == (300, 201088, True)
    resolved = offline.describe()["resolved"]
    assert (resolved["max_num_seqs"], resolved["device"], resolved["quantization"]) == (5, "cpu", None)
    server = vllm_backend.create(run_config(checkpoints["bf16"], INLINE))
    assert server.final_only is False and server.max_model_len == 131072  # the checkpoint's own
    forced = vllm_backend.create(run_config(checkpoints["bf16"], ["--vllm-output-kind", "delta"], "offline"))
    assert forced.final_only is False


def test_the_process_follows_the_scenario_unless_forced(checkpoints):
    from backends.vllm import VllmBackend
    from backends.vllm_server import VllmServerBackend

    def kind(flags, scenario):
        return type(vllm_backend.create(run_config(checkpoints["bf16"], flags, scenario)))

    assert kind([], "offline") is VllmBackend
    assert kind([], "server") is VllmServerBackend
    assert kind([], "interactive") is VllmServerBackend
    assert kind(INLINE, "server") is VllmBackend
    assert kind(["--vllm-process", "server"], "offline") is VllmServerBackend
    # Nothing starts before __aenter__; the server resolves vLLM's serving defaults, inline the LLM
    # class's (on CPU: 128 and 256 sequences).
    server = vllm_backend.create(run_config(checkpoints["bf16"], []))
    inline = vllm_backend.create(run_config(checkpoints["bf16"], INLINE))
    assert server.describe()["server"]["pid"] is None and server.describe()["process"] == "server"
    assert inline.describe()["process"] == "inline"
    assert (server.describe()["resolved"]["max_num_seqs"], inline.describe()["resolved"]["max_num_seqs"]) == (
        128,
        256,
    )
    assert server.final_only is False and server.max_model_len == 131072 and server.vocab_size == 201088
    offline = vllm_backend.create(run_config(checkpoints["bf16"], ["--vllm-process", "server"], "offline"))
    assert offline.final_only is True  # whole replies, no SSE


def test_sampling_settings_map_exactly(checkpoints):
    from vllm.sampling_params import RequestOutputKind

    backend = vllm_backend.create(run_config(checkpoints["bf16"], INLINE))
    sp = backend._vllm_params(SamplingParams(max_new_tokens=77, temperature=0.6, top_p=0.9, top_k=0, seed=5))
    assert (sp.max_tokens, sp.temperature, sp.top_p, sp.top_k, sp.seed) == (77, 0.6, 0.9, 0, 5)
    assert sp.stop_token_ids == [200002, 200012, 199999]
    # vLLM's own EOS logic is off: only our stop ids stop a request, whatever generation_config.json says.
    assert sp.ignore_eos is True and sp.detokenize is False and sp.skip_special_tokens is False
    assert sp.output_kind == RequestOutputKind.DELTA and sp.n == 1
    no_stop = backend._vllm_params(SamplingParams(max_new_tokens=3, top_k=20, ignore_eos=True))
    assert no_stop.stop_token_ids == [] and no_stop.top_k == 20
    backend.final_only = True
    assert backend._vllm_params(SamplingParams(max_new_tokens=3)).output_kind == RequestOutputKind.FINAL_ONLY

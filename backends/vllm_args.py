"""Flags of the vllm backend -> VllmOptions -> AsyncEngineArgs keyword arguments, checked by vLLM itself.

No vLLM import at module level: --help and option parsing (harness/cli.py reads VllmOptions' field
metadata) work without it. Only _convert_extra imports vLLM, to type --vllm-arg values exactly as
`vllm serve` types its own flags.
"""

from __future__ import annotations

import argparse
import difflib
import json
import shlex
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from backends.base import BackendError

# Only what the user sets reaches vLLM, plus these (documented in README):
# - skip_tokenizer_init: token ids in and out, no tokenizer files needed;
# - disable_log_stats: as vLLM's own offline LLM class (periodic stat lines cost time);
# - on CPU, a fixed KV cache (vLLM's gpu_memory_utilization share of a NUMA node minus the
#   worker's resident size goes negative on small machines), unless memory is set by the user;
# - in Server and Interactive, at most 2048 prompt tokens a step unless the user says otherwise: a long
#   prefill step stalls every running decode. On an H100 (bench/results 2026-11-23 v11, 500 x (1024 ->
#   512)) vLLM's own default of 8192 made 8 QPS INVALID (TPOT p99 104.6 ms); 2048 kept 8-24 QPS VALID.
CPU_KV_CACHE_BYTES = 1 << 30
LATENCY_BATCHED_TOKENS = 2048
DEFAULTS: dict[str, Any] = {"disable_log_stats": True}
RESERVED = {"model": "--model-path", "skip_tokenizer_init": "(always on: token ids in and out)"}
OUTPUT_KINDS = ("auto", "delta", "final")
PROCESSES = ("auto", "server", "inline")
DEFAULT_START_TIMEOUT_S = 1200.0  # vLLM 0.26 takes ~190 s for gpt-oss-20b on an H100, ~30 s on CPU
MOE_IMPLS = ("vllm", "gptoss")  # gptoss.vllm_plugin.MODES, without importing it here


class VllmOptionError(BackendError):
    """vLLM rejected an engine option; raised by create(), before LoadGen starts."""


# ----------------------------------------------------------------------------- flags

DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")  # vLLM's ModelDType


def _json(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def _pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def _engine(help: str, default: str, **more: Any) -> Any:
    """An AsyncEngineArgs field under vLLM's own flag name; unset (None), vLLM's default stays."""
    return field(default=None, metadata={"help": help, "default_help": default, "engine": True, **more})


@dataclass(frozen=True, slots=True)
class VllmOptions:
    """The vllm backend's flags. Fields marked "engine" reach AsyncEngineArgs under their own name,
    and only when set, so vLLM's defaults stay in force."""

    tensor_parallel_size: int | None = _engine("GPUs per model replica", "vLLM's, 1")
    data_parallel_size: int | None = _engine("model replicas", "vLLM's, 1")
    enable_expert_parallel: bool | None = _engine(
        "shard MoE experts over the GPUs instead of tensor-slicing them", "vLLM's, off"
    )
    max_num_seqs: int | None = _engine(
        "most sequences per engine step",
        "vLLM's: 1024 on H100/H200; 256 on CPU inline, 128 as a server",
    )
    max_num_batched_tokens: int | None = _engine(
        "token budget per engine step", "vLLM's: on H100/H200 16384 inline, 8192 as a server"
    )
    dtype: str | None = _engine("weights and activations", "vLLM's, auto: the checkpoint's", choices=DTYPES)
    max_model_len: int | None = _engine("context length, prompt + output", "the checkpoint's")
    gpu_memory_utilization: float | None = _engine(
        "share of GPU memory vLLM may take", "vLLM's, 0.9; on CPU a 1 GiB KV cache, see README"
    )
    kv_cache_dtype: str | None = _engine("KV cache dtype: auto, fp8, ...", "vLLM's, auto")
    async_scheduling: bool | None = _engine("overlap scheduling with the forward pass", "vLLM's, on")
    enable_prefix_caching: bool | None = _engine("reuse KV of shared prompt prefixes", "vLLM's, on")
    compilation_config: dict[str, Any] | None = _engine(
        "vLLM CompilationConfig as JSON, e.g. '{\"cudagraph_capture_sizes\": [1, 8, 64]}'",
        "vLLM's",
        type=_json,
        metavar="JSON",
    )
    enforce_eager: bool | None = _engine(
        "no torch.compile and no CUDA graphs (faster start, slower steps)", "vLLM's, off"
    )
    enable_lora: bool | None = _engine("LoRA support (implied by --lora-modules)", "vLLM's, off")
    lora: tuple[str, str] | None = field(
        default=None,
        metadata={
            "help": "serve every request through this LoRA adapter (PEFT folder); implies --enable-lora",
            "flag": "--lora-modules",
            "type": _pair,
            "metavar": "NAME=PATH",
            "default_help": "none",
        },
    )
    extra_args: tuple[tuple[str, str], ...] = field(
        default=(),
        metadata={
            "help": "any other AsyncEngineArgs field, as `vllm serve --KEY VALUE` would read it "
            "(repeatable); a switch takes true/false, e.g. --vllm-arg max_lora_rank=64 --vllm-arg "
            "disable_log_stats=false",
            "flag": "--vllm-arg",
            "type": _pair,
            "metavar": "KEY=VALUE",
            "repeat": True,
            "default_help": "none",
        },
    )
    output_kind: str = field(
        default="auto",
        metadata={
            "help": "auto: whole outputs in Offline (FINAL_ONLY, fewer wake-ups), token deltas otherwise",
            "flag": "--vllm-output-kind",
            "choices": OUTPUT_KINDS,
        },
    )

    process: str = field(
        default="auto",
        metadata={
            "help": "server: vLLM's OpenAI server (python -m vllm.entrypoints.openai.api_server) as a child "
            "process on 127.0.0.1, driven over HTTP with token ids, so its output handling has its own "
            "interpreter, not LoadGen's and the SUT's; inline: AsyncLLM in this process; auto: server "
            "for the server and interactive scenarios, inline for offline",
            "flag": "--vllm-process",
            "choices": PROCESSES,
        },
    )
    start_timeout_s: float = field(
        default=DEFAULT_START_TIMEOUT_S,
        metadata={
            "help": "--vllm-process server: seconds vLLM's server may take until GET /health answers",
            "flag": "--vllm-start-timeout",
            "metavar": "S",
        },
    )

    moe_impl: str = field(
        default="vllm",
        metadata={
            "help": "who runs gpt-oss's MXFP4 experts: vllm (its own kernels) or gptoss (ours, through "
            "the project's vLLM plugin; on CPU it runs the MXFP4 checkpoint without AMX)",
            "flag": "--vllm-moe",
            "choices": MOE_IMPLS,
        },
    )
    fallback_tokens: int | None = field(
        default=None,
        metadata={
            "help": "with --vllm-moe gptoss on CUDA: our MoE for steps of up to N tokens, vLLM's own "
            "above (both weight layouts stay loaded: twice the experts' memory)",
            "flag": "--vllm-moe-max-tokens",
            "metavar": "N",
            "default_help": "ours at every size",
        },
    )

    def __post_init__(self) -> None:  # the rest is vLLM's to check (create() reports what it rejects)
        if self.moe_impl not in MOE_IMPLS:
            raise ValueError(f"moe_impl must be one of {', '.join(MOE_IMPLS)}, got {self.moe_impl!r}")
        if self.fallback_tokens is not None:
            if self.fallback_tokens < 1:
                raise ValueError(f"fallback_tokens must be at least 1, got {self.fallback_tokens}")
            if self.moe_impl != "gptoss":
                raise ValueError("fallback_tokens applies to moe_impl gptoss only")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.process not in PROCESSES:
            raise ValueError(f"process must be one of {', '.join(PROCESSES)}, got {self.process!r}")
        if not 0 < self.start_timeout_s < float("inf"):
            raise ValueError(f"start_timeout_s must be a number of seconds > 0, got {self.start_timeout_s}")
        if self.output_kind not in OUTPUT_KINDS:
            raise ValueError(
                f"output_kind must be one of {', '.join(OUTPUT_KINDS)}, got {self.output_kind!r}"
            )

    def resolved_process(self, scenario: str) -> str:
        """ "server" or "inline": auto is inline for Offline (no latencies to spoil, no HTTP in the
        way of throughput), server otherwise."""
        if self.process != "auto":
            return self.process
        return "inline" if scenario == "offline" else "server"

    @property
    def engine_args(self) -> dict[str, Any]:
        """The named engine flags that were set, as AsyncEngineArgs keyword arguments."""
        return {
            f.name: v
            for f in fields(self)
            if f.metadata.get("engine") and (v := getattr(self, f.name)) is not None
        }


# ----------------------------------------------------------------------------- engine args


def _switch(key: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on", ""):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise VllmOptionError(f"--vllm-arg {key}={raw}: {key} is a switch, give true or false")


def _convert_extra(pairs: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """--vllm-arg pairs -> AsyncEngineArgs kwargs, typed exactly as `vllm serve` types its flags."""
    if not pairs:
        return {}
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser(prog="vllm"))
    known = parser._option_string_actions  # argparse's own registry of option strings
    out: dict[str, Any] = {}
    for key, raw in pairs:
        option = "--" + key.replace("_", "-")
        action = known.get(option)
        if action is None:
            names = sorted({o[2:].replace("-", "_") for o in known if o.startswith("--")})
            close = difflib.get_close_matches(key.replace("-", "_"), names, n=3)
            hint = f" Did you mean: {', '.join(close)}?" if close else ""
            raise VllmOptionError(f"--vllm-arg {key}={raw}: vLLM's engine has no option '{key}'.{hint}")
        if action.nargs == 0:  # store_true / --x --no-x
            out[action.dest] = _switch(key, raw)
            continue
        values = shlex.split(raw) if action.nargs in ("+", "*") else [raw]

        def fail(message: str, key=key, raw=raw) -> None:
            raise VllmOptionError(f"--vllm-arg {key}={raw}: vLLM rejected it: {message}")

        parser.error = fail  # argparse reports bad values through error(); raise instead of exiting
        ns, _ = parser.parse_known_args([option, *values])
        out[action.dest] = getattr(ns, action.dest)
    return out


def engine_kwargs(
    model_path: Path, opts: VllmOptions, *, on_cpu: bool, latency: bool = False
) -> dict[str, Any]:
    """The AsyncEngineArgs keyword arguments: the user's settings plus our documented defaults.
    latency: a Server or Interactive run (LATENCY_BATCHED_TOKENS)."""
    named = opts.engine_args
    extra = _convert_extra(opts.extra_args)
    for key in extra:
        if key in RESERVED:
            raise VllmOptionError(f"--vllm-arg {key}: not settable; {key} is {RESERVED[key]}")
        if key in named:
            flag = "--" + key.replace("_", "-")
            raise VllmOptionError(f"--vllm-arg {key} repeats {flag}; give it once")
    user = named | extra
    if opts.lora is not None:
        user.setdefault("enable_lora", True)
    if user.get("enable_lora") and user.get("enforce_eager") and not on_cpu:
        # Its first step dies in the q/k/v LoRA shrink (lora_shrink_op: `assert inputs.is_contiguous()`,
        # EngineDeadError for every query; H100, 2026-11-26); the compiled path runs the adapter.
        raise VllmOptionError(
            "--enforce-eager with LoRA: vLLM 0.26 fails gpt-oss's first step in eager mode (its LoRA "
            "shrink gets non-contiguous q/k/v input); drop --enforce-eager"
        )
    kwargs = dict(DEFAULTS) | user
    if on_cpu and not {"gpu_memory_utilization", "kv_cache_memory_bytes"} & user.keys():
        kwargs["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
    if latency:
        kwargs.setdefault("max_num_batched_tokens", LATENCY_BATCHED_TOKENS)
    return {"model": str(model_path), "skip_tokenizer_init": True} | kwargs

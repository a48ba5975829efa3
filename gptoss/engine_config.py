"""EngineConfig: the engine's settings, whose flag fields are the flags of --backend gptoss and of
python -m gptoss.serve (no torch here, so the flags parse without it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gptoss.lora_spec import split_lora_spec

DTYPES = ("bfloat16", "float32")
KV_CACHE_DTYPES = ("auto", "fp8")  # gptoss.kv_dtype


def _flag(help: str, **more: object) -> dict[str, object]:
    """Field metadata that makes the field a flag (read by harness/cli.py and gptoss/serve/main.py)."""
    return {"help": help, **more}


def _device_list(text: str) -> tuple[str, ...]:
    """--devices cuda:0,cuda:1 -> ("cuda:0", "cuda:1"); EngineConfig checks each one."""
    return tuple(d.strip() for d in text.split(","))


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """The engine's settings. The fields with flag metadata are the flags of --backend gptoss and of
    python -m gptoss.serve, so a knob is declared once, here."""

    model_path: Path | None = None  # set before the engine starts (--model-path is a flag of its own)
    device: str | None = field(
        default=None,
        metadata=_flag("cpu, cuda or cuda:N", default_help="cuda when torch sees a GPU, else cpu"),
    )
    dtype: str = field(default="bfloat16", metadata=_flag("activations and KV cache", choices=DTYPES))
    max_num_seqs: int = field(default=256, metadata=_flag("most running requests"))
    max_num_batched_tokens: int = field(
        default=8192, metadata=_flag("tokens per engine step; longer prompts prefill in chunks")
    )
    max_model_len: int | None = field(
        default=None,
        metadata=_flag("prompt + output limit", default_help="the checkpoint's, capped by the KV cache"),
    )
    kv_cache_tokens: int | None = field(
        default=None,
        metadata=_flag(
            "KV cache size in tokens (gpt-oss: one pool for full and sliding layers; a sequence takes its "
            "length plus up to one window)",
            default_help="sized from free memory",
        ),
    )
    kv_cache_dtype: str = field(
        default="auto",
        metadata=_flag(
            "KV cache elements: auto stores --dtype, fp8 float8 e4m3 (scale 1, saturating): twice the "
            "tokens in the same memory and half the attention reads, at 3 mantissa bits",
            choices=KV_CACHE_DTYPES,
        ),
    )
    block_size: int = 16
    data_parallel_size: int = field(
        default=1,
        metadata=_flag("engine replicas, one process per device (cuda:0 … cuda:N-1); least loaded first"),
    )
    engine_process: bool | None = field(
        default=None,
        metadata=_flag(
            "run a single engine in its own process, as replicas run, so the caller (LoadGen, asyncio) "
            "and the engine share no GIL: on the H100 the in-process engine gave the harness 0.77x the "
            "raw engine's Offline tokens/s, its own process 0.98x",
            default_help="on when the engine runs on CUDA, off on CPU",
        ),
    )
    devices: tuple[str, ...] | None = field(
        default=None,
        metadata=_flag(
            "one replica per listed device, e.g. cuda:0,cuda:1 (cpu,cpu on CPU); instead of --device",
            type=_device_list,
            metavar="DEV,DEV,...",
            default_help="--data-parallel-size times --device",
        ),
    )
    seed: int = field(default=0, metadata=_flag("seeds the sampling of requests that carry no seed"))
    kernels: str | None = field(
        default=None,
        metadata=_flag(
            "torch: the reference model; triton: our fused kernels",
            choices=("torch", "triton"),
            default_help="triton on CUDA, torch on CPU",
        ),
    )
    cuda_graphs: bool = field(
        default=True, metadata=_flag("replay CUDA graphs for decode steps (triton kernels on CUDA)")
    )
    decode_steps: int = field(
        default=8,
        metadata=_flag(
            "decode steps run back to back on the GPU when no waiting request could join "
            "(CUDA graphs only; 1: a host round trip every step)"
        ),
    )
    warm_kernels: bool = field(
        default=True,
        metadata=_flag(
            "before the first request, run a short synthetic workload (gptoss.warmup: odd and full-budget "
            "steps, prefill chunks beside decodes, decode bursts, a sampled request) so Triton compiles "
            "every kernel specialization at start-up, not inside a timed run; triton kernels on CUDA only"
        ),
    )
    precompile: bool = field(
        default=True,
        metadata=_flag(
            "while the checkpoint loads, compile on background threads the Triton kernel specializations "
            "recorded for this GPU and model (gptoss/kernels/specs, gptoss.tools.record_specs), so a "
            "fresh machine's start-up does not compile them one at a time; triton kernels on CUDA only"
        ),
    )
    batch_invariant: bool = field(
        default=False,
        metadata=_flag(
            "kernels chosen by shapes alone, never by batch size (gptoss.kernels.batch_invariant): a "
            "sequence's tokens are the same alone and in any batch; triton kernels only, no LoRA; slower"
        ),
    )
    lora: tuple[str, ...] = field(
        default=(),
        metadata=_flag(
            "a PEFT LoRA adapter folder (q/k/v/o_proj, experts; rank <= 64), applied unmerged; "
            "repeatable as NAME=PATH, a request picks one by name (run_mlperf: one, for every query)",
            type=str,
            repeat=True,
            metavar="[NAME=]PATH",
            default_help="none",
        ),
    )

    def __post_init__(self) -> None:
        if self.device is not None and self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, got {self.device!r}")
        if self.kernels not in (None, "torch", "triton"):
            raise ValueError(f"kernels must be torch or triton, got {self.kernels!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}"
            )
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "decode_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_model_len", "kv_cache_tokens"):
            value = getattr(self, name)
            if value is not None and value < 2:
                raise ValueError(f"{name} must be >= 2, got {value}")
        if self.batch_invariant and self.kernels == "torch":
            raise ValueError("batch_invariant needs the triton kernels (kernels triton), not torch")
        if self.batch_invariant and self.lora:
            raise ValueError("batch_invariant does not cover LoRA adapters")
        names = [split_lora_spec(s)[0] for s in self.lora]
        if dup := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"lora: two adapters are named {dup[0]!r}; name them NAME=PATH")
        self._check_replicas()

    def _check_replicas(self) -> None:
        n, devices = self.data_parallel_size, self.devices
        if n < 1:
            raise ValueError(f"data_parallel_size must be >= 1, got {n}")
        if n > 1 and self.device not in (None, "cpu", "cuda"):
            raise ValueError(
                f"data_parallel_size {n} with device {self.device}: name each replica's GPU in devices "
                "instead (e.g. cuda:0,cuda:1)"
            )
        if devices is None:
            return
        if self.device is not None:
            raise ValueError("give device or devices, not both")
        if not devices or n not in (1, len(devices)):
            raise ValueError(f"devices names {len(devices)} replicas but data_parallel_size is {n}")
        for d in devices:
            kind, _, index = d.partition(":")
            if kind not in ("cpu", "cuda") or (index and not index.isdigit()) or (kind == "cpu" and index):
                raise ValueError(f"devices: {d!r} is not cpu, cuda or cuda:N")
            if kind == "cuda" and not index and len(devices) > 1:
                raise ValueError(f"devices: give each GPU's index (cuda:0,cuda:1 ...), not {d!r}")
        gpus = [d for d in devices if d.startswith("cuda")]
        if len(set(gpus)) < len(gpus):
            raise ValueError(f"devices: each GPU may hold one replica, got {','.join(devices)}")

    def own_process(self, has_cuda: bool) -> bool:
        """Whether a single engine runs in a process of its own: engine_process, else on CUDA."""
        if self.engine_process is not None:
            return self.engine_process
        return self.replica_devices(has_cuda)[0].startswith("cuda")

    @property
    def num_replicas(self) -> int:
        return len(self.devices) if self.devices is not None else self.data_parallel_size

    def replica_devices(self, has_cuda: bool) -> tuple[str, ...]:
        """One device per engine replica: devices, else data_parallel_size times device (cuda becomes
        cuda:0 … cuda:N-1); with no device, cuda when torch sees a GPU (`has_cuda`), else cpu."""
        if self.devices is not None:
            return self.devices
        device = self.device or ("cuda" if has_cuda else "cpu")
        n = self.data_parallel_size
        if n > 1 and device == "cuda":
            return tuple(f"cuda:{i}" for i in range(n))
        return (device,) * n

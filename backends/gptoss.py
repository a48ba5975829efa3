"""The gptoss backend: our own engine, in this process (gptoss.async_engine.AsyncEngine) or, with
--data-parallel-size N / --devices, as N replica processes (gptoss.dp_engine.DPEngine).

Its flags are gptoss.engine.EngineConfig's fields. torch is imported only when the backend
starts, so --help works without it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, ClassVar, Self

from backends.base import BackendError, RunSpec, SamplingParams
from gptoss.engine import EngineConfig
from gptoss.lora_spec import split_lora_spec
from gptoss.sampling import SamplingParams as EngineSamplingParams


def create(cfg: RunSpec) -> GptossBackend:
    opts = cfg.backend_options if cfg.backend_options is not None else EngineConfig()
    if not isinstance(opts, EngineConfig):
        raise BackendError(f"gptoss backend got options of type {type(opts).__name__}, expected EngineConfig")
    if cfg.model_path is not None:
        opts = replace(opts, model_path=Path(cfg.model_path))
    if len(opts.lora) > 1:
        raise BackendError(
            f"--lora is given {len(opts.lora)} times: run_mlperf sends every query through one adapter "
            "(python -m gptoss.serve serves several, picked per request)"
        )
    # Offline has no first-token timing: whole outputs, one wake-up per request (as vLLM's FINAL_ONLY).
    return GptossBackend(opts, final_only=cfg.scenario == "offline")


def engine_params(p: SamplingParams) -> EngineSamplingParams:
    return EngineSamplingParams(
        max_new_tokens=p.max_new_tokens,
        temperature=p.temperature,
        top_p=p.top_p,
        top_k=p.top_k,
        ignore_eos=p.ignore_eos,
        seed=p.seed,
        stop_token_ids=p.stop_token_ids,
    )


class GptossBackend:
    name: ClassVar[str] = "gptoss"
    in_process: ClassVar[bool] = True
    Options: ClassVar[type] = EngineConfig

    def __init__(self, config: EngineConfig, final_only: bool = False) -> None:
        self.config = config
        self.final_only = final_only  # model_path None: the default checkpoint, resolved at start
        self.max_model_len: int | None = None
        self.vocab_size: int | None = None
        self._engine = None  # AsyncEngine or DPEngine (gptoss.dp_engine.open_engine) once started
        self._params: dict[SamplingParams, EngineSamplingParams] = {}  # one conversion per distinct setting
        # Every query goes through the one --lora adapter, if given.
        self._lora = split_lora_spec(config.lora[0])[0] if config.lora else None
        self._describe: dict[str, Any] = {
            "backend": self.name,
            "options": {k: v for k, v in asdict(config).items() if k != "model_path"},
            "output": "final" if final_only else "delta",
        }

    @classmethod
    def default_model_path(cls) -> Path:
        from gptoss.default import default_checkpoint

        return default_checkpoint()

    async def __aenter__(self) -> Self:
        import torch

        from gptoss.dp_engine import ReplicaStartError, open_engine

        config = self.config
        if config.model_path is None:
            config = replace(config, model_path=await asyncio.to_thread(self.default_model_path))
        try:
            engine = open_engine(config)
            await engine.__aenter__()
        except (ValueError, OSError, ReplicaStartError) as e:
            raise BackendError(f"gptoss engine could not start on {config.model_path}: {e}") from e
        self._engine = engine
        self.max_model_len, self.vocab_size = engine.max_model_len, engine.vocab_size
        self._describe |= {"model_path": str(config.model_path), "torch": torch.__version__} | engine.info()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._engine is not None:
            engine, self._engine = self._engine, None
            await engine.__aexit__(*exc)

    async def stream(self, prompt: list[int], params: SamplingParams) -> AsyncIterator[list[int]]:
        from gptoss.engine import EngineError

        if self._engine is None:
            raise BackendError("gptoss backend used outside `async with`")
        ep = self._params.get(params)
        if ep is None:
            ep = self._params[params] = engine_params(params)
        try:
            deltas = self._engine.generate(prompt, ep, final_only=self.final_only, lora=self._lora)
        except ValueError as e:
            raise BackendError(f"gptoss refused the request: {e}") from e
        except EngineError as e:  # e.g. every data-parallel replica has died
            raise _backend_error(e) from e
        try:
            async for delta in deltas:
                if delta.token_ids:
                    yield delta.token_ids
                if delta.finish_reason == "abort":
                    raise BackendError("gptoss aborted the request")
        except EngineError as e:
            raise _backend_error(e) from e
        finally:
            deltas.close()  # aborts the request if it is still running (consumer left early)

    def describe(self) -> dict[str, Any]:
        return dict(self._describe)


def _backend_error(e: Exception) -> BackendError:
    """A subclass of EngineError (ReplicaDiedError) names itself in the failure report."""
    return BackendError(str(e) if type(e).__name__ == "EngineError" else f"{type(e).__name__}: {e}")

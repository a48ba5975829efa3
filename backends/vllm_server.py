"""--backend vllm --vllm-process server: the same vLLM engine as vLLM's own OpenAI server, in a child process.

In process, AsyncLLM's output handling shares one interpreter (the GIL) with LoadGen and the SUT: on
an H100 at 8 QPS Server its TPOT p99 was 108-141 ms against 55 ms for the same vLLM as its own server
(bench/results/2026-11-22_gptoss_gpu.md, v10). So outside Offline the backend starts
`python -m vllm.entrypoints.openai.api_server` on 127.0.0.1 with the inline path's engine options
(backends.vllm_cli), waits for GET /health, and sends token ids through the openai backend's
client; the child and everything it starts are stopped when the run ends (backends.server_process).
"""

from __future__ import annotations

import shlex
import shutil
import signal
import sys
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

from backends.base import BackendError, RunSpec, SamplingParams
from backends.http_errors import HttpBackendError, ServerConnectError, StreamBrokenError
from backends.openai import OpenAIBackend, OpenAIOptions, request_fields
from backends.server_process import ServerProcess, free_port
from backends.vllm import check_prompt, cut_short, plain, resolved_settings
from backends.vllm_args import VllmOptions
from backends.vllm_cli import MODULE, server_flags

LOG_NAME = "vllm_server.log"
HOST = "127.0.0.1"
# A dropped connection can arrive a moment before the kernel reports the server's exit; a failed
# request waits this long for it, so that the failure names the cause.
EXIT_WAIT_S = 2.0


class VllmServerExitedError(BackendError):
    """vLLM's server process is gone: the requests it was serving, and every later one, fail."""


@dataclass(frozen=True, slots=True)
class _ClientSpec:
    """The RunSpec the openai backend's client reads: one server, ours."""

    scenario: str
    server_urls: tuple[str, ...]
    max_concurrency: int | None
    timeout_s: float | None
    backend_options: OpenAIOptions
    log_dir: Path
    model_path: Path | None = None


def vllm_fields(p: SamplingParams) -> dict[str, Any]:
    """The openai backend's sampling fields, with vLLM's own EOS off as inline: the checkpoint's
    generation_config.json never stops a request, only the stop ids sent (none with ignore_eos)."""
    return request_fields(p) | {"ignore_eos": True}


def server_command(kwargs: dict[str, Any], opts: VllmOptions, port: int) -> tuple[list[str], str]:
    """The api_server's argv for the engine options `kwargs`, and the model name requests use."""
    settings = dict(kwargs)
    settings.setdefault("served_model_name", [Path(kwargs["model"]).name or "model"])
    # The server would fill sampling fields a request leaves out (top_k when 0 ...) from the
    # checkpoint's generation_config.json; AsyncLLM inline never does: "vllm" keeps them out.
    settings.setdefault("generation_config", "vllm")
    settings |= {"host": HOST, "port": port, "disable_uvicorn_access_log": True}  # a log line a request
    model = settings["served_model_name"][0]
    if opts.lora is not None:
        settings["lora_modules"] = [f"{opts.lora[0]}={Path(opts.lora[1]).resolve()}"]
        model = opts.lora[0]  # requests that name the adapter go through it
    return [sys.executable, "-m", MODULE, *server_flags(settings)], model


class VllmServerBackend:
    name: ClassVar[str] = "vllm"
    in_process: ClassVar[bool] = True  # it starts its own server: --server-url means nothing to it
    Options: ClassVar[type] = VllmOptions

    def __init__(
        self,
        cfg: RunSpec,
        vllm_config: Any,
        kwargs: dict[str, Any],
        opts: VllmOptions,
        *,
        final_only: bool,
        moe: dict[str, Any],
        moe_report: Path | None,
    ) -> None:
        self._cfg = cfg
        self._config = vllm_config  # resolved here as the server resolves it (OPENAI_API_SERVER)
        self._kwargs = kwargs
        self._opts = opts
        self.final_only = final_only  # whole replies (no SSE) instead of streamed deltas
        self._moe = dict(moe)
        self._moe_report = moe_report
        self.max_model_len: int = vllm_config.model_config.max_model_len
        self.vocab_size: int = vllm_config.model_config.get_vocab_size()
        self.truncated = 0  # requests cut by max_model_len before their max_new_tokens
        self.command: list[str] | None = None
        self.url: str | None = None
        self._model: str | None = None
        self._server: ServerProcess | None = None
        self._client: OpenAIBackend | None = None
        self._ready_s: float | None = None

    @classmethod
    def default_model_path(cls) -> None:
        return None

    async def __aenter__(self) -> Self:
        port = free_port(HOST)
        self.url = f"http://{HOST}:{port}"
        self.command, self._model = server_command(self._kwargs, self._opts, port)
        self._server = ServerProcess("vLLM's server", self.command, Path(self._cfg.log_dir) / LOG_NAME)
        print(
            f"starting vLLM's server on {self.url} (log: {self._server.log_path})",
            file=sys.stderr,
            flush=True,
        )
        self._server.start()
        try:
            self._ready_s = await self._server.wait_ready(
                self.url + "/health", self._opts.start_timeout_s, "--vllm-start-timeout"
            )
            options = OpenAIOptions(
                openai_model=self._model,
                stream=not self.final_only,
                first_token_timeout_s=None,  # as inline: a request may queue in vLLM for as long as it takes
                ready_timeout_s=30.0,  # it answered /health already
            )
            spec = _ClientSpec(
                self._cfg.scenario,
                (self.url,),
                self._cfg.max_concurrency,
                self._cfg.timeout_s,
                options,
                self._server.log_path.parent,
            )
            client = OpenAIBackend(spec, fields=vllm_fields)
            await client.__aenter__()
            self._client = client
            await self._probe()
            if self._moe_report is not None:
                self._check_moe()
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def _probe(self) -> None:
        """One 1-token request before LoadGen starts, as inline (a setup vLLM starts with but cannot run)."""
        try:
            async for _ in self.stream(
                [0], SamplingParams(max_new_tokens=1, temperature=0.0, ignore_eos=True)
            ):
                pass
        except BackendError as e:
            lora = self._opts.lora
            what = f"--lora-modules {lora[0]}={lora[1]}: " if lora else ""
            raise BackendError(
                f"{what}vLLM's server started but failed its first request: {e} "
                f"(log: {self._server.log_path})"
            ) from e

    def _check_moe(self) -> None:
        """--vllm-moe gptoss: the server's engine processes report our MoE (see backends.vllm)."""
        from gptoss.vllm_plugin import read_reports

        built = read_reports(self._moe_report)
        if not built:
            raise BackendError(
                "--vllm-moe gptoss: vLLM's server started, but none of its processes built our MoE "
                "(did they load the gptoss_moe plugin? see VLLM_PLUGINS)"
            )
        self._moe["built"] = built

    async def __aexit__(self, *exc: object) -> None:
        client, self._client = self._client, None
        try:
            if client is not None:
                await client.__aexit__(None, None, None)
        finally:
            if self._server is not None:
                await self._server.stop()
            if self._moe_report is not None:
                shutil.rmtree(self._moe_report, ignore_errors=True)

    def _exited(self, code: int) -> VllmServerExitedError:
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        return VllmServerExitedError(f"vLLM's server process {how} (log: {self._server.log_path})")

    async def stream(self, prompt: list[int], params: SamplingParams):
        if self._client is None:
            raise BackendError("the vllm backend is not started (use it inside `async with`)")
        check_prompt(prompt, self.vocab_size, self.max_model_len)
        n, last = 0, -1
        try:
            async with aclosing(self._client.stream(prompt, params)) as chunks:
                async for ids in chunks:
                    n += len(ids)
                    last = ids[-1]
                    yield ids
        except HttpBackendError as e:
            code = self._server.returncode
            if code is None and isinstance(e, ServerConnectError | StreamBrokenError):
                code = await self._server.exited(EXIT_WAIT_S)
            if code is not None:
                raise self._exited(code) from e
            raise
        if n < params.max_new_tokens and (params.ignore_eos or last not in params.stop_token_ids):
            # Neither max_new_tokens nor a stop id ended it: the context window did (vLLM's server
            # caps a request there and reports "length", as inline).
            self.truncated += 1
            raise cut_short(self.max_model_len, n, params, len(prompt))

    def describe(self) -> dict[str, Any]:
        import vllm

        server = self._server
        return {
            "vllm_version": vllm.__version__,
            "process": "server",
            "server": {
                "command": shlex.join(self.command) if self.command else None,
                "url": self.url,
                "pid": server.pid if server else None,
                "log": str(server.log_path) if server else None,
                "ready_after_s": round(self._ready_s, 1) if self._ready_s is not None else None,
                "start_timeout_s": self._opts.start_timeout_s,
            },
            "engine_args": {k: plain(v) for k, v in self._kwargs.items()},
            "output_kind": "FINAL_ONLY" if self.final_only else "DELTA",
            "lora": {"name": self._opts.lora[0], "path": self._opts.lora[1]} if self._opts.lora else None,
            "moe": self._moe,
            "resolved": resolved_settings(self._config),
            "http": self._client.describe() if self._client is not None else None,
        }

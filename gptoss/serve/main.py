"""Serve the gptoss engine over HTTP: SGLang's native /generate and OpenAI's /v1/completions.

    python -m gptoss.serve [--model-path DIR] [--host 127.0.0.1] [--port 30000]
                           [--incremental-streaming-output] [--stream-interval N]
                           [--data-parallel-size N | --devices cuda:0,cuda:1,...] ...

Streams are SSE (`data: {json}` ... `data: [DONE]`). /generate repeats all output ids in every chunk
unless --incremental-streaming-output, exactly as SGLang does. Binds 127.0.0.1 unless --host says
otherwise; bodies over --max-request-bytes get 413, prompts that do not fit the context 400, and
more than --max-num-seqs x replicas + --max-queued-requests requests at once 503. SIGTERM or
SIGINT: stop accepting (503), let running requests finish for up to --shutdown-timeout seconds,
then abort the rest (each stream ends with an abort event and [DONE]) and exit 0. With several
replicas (one process per GPU, gptoss.dp_engine) one server fronts every GPU of the node.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import math
import re
import signal
import sys
import typing
from pathlib import Path
from typing import Any

from aiohttp import web

from gptoss.engine import EngineConfig
from gptoss.serve.app import Server, build_app

log = logging.getLogger("gptoss.serve")

# After the drain: how long cut streams get to write their abort event, and aiohttp its connections.
ABORT_GRACE_S = 2.0
CLOSE_TIMEOUT_S = 1.0


# ----------------------------------------------------------------------------- flags


def _seconds(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text}")
    return value


def _engine_flags(group: argparse._ArgumentGroup) -> list[dataclasses.Field]:
    """EngineConfig's flag fields as flags: the same declaration --backend gptoss uses."""
    hints = typing.get_type_hints(EngineConfig)
    flags = [f for f in dataclasses.fields(EngineConfig) if "help" in f.metadata]
    for f in flags:
        shown = f.metadata.get("default_help", f.default)
        kw: dict[str, object] = {"dest": f.name, "default": f.default}
        if hints[f.name] is bool:
            kw["action"] = argparse.BooleanOptionalAction
            shown = "on" if f.default else "off"
        elif f.metadata.get("repeat"):  # collected into a list, then the field's tuple
            kw |= {"action": "append", "default": [], "metavar": f.metadata.get("metavar")}
        else:
            int_field = int in (hints[f.name], *typing.get_args(hints[f.name]))
            kw["type"] = f.metadata.get("type") or (int if int_field else str)
            kw["choices"] = f.metadata.get("choices")
            kw["metavar"] = f.metadata.get("metavar")
        group.add_argument(_flag_name(f), help=f"{f.metadata['help']} (default: {shown})", **kw)
    return flags


def _flag_name(f: dataclasses.Field) -> str:
    return "--" + f.name.replace("_", "-")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m gptoss.serve",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--model-path",
        type=Path,
        default=None,
        help="checkpoint directory (default: the tiny random checkpoint, made once and cached)",
    )
    ap.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)"
    )
    ap.add_argument(
        "--port", type=int, default=30000, help="port (default 30000, SGLang's; 0 picks a free one)"
    )
    ap.add_argument(
        "--served-model-name", default=None, help="`model` of the OpenAI API (default: the directory name)"
    )
    ap.add_argument(
        "--incremental-streaming-output",
        action="store_true",
        help="/generate chunks carry only new ids (default: all ids so far, as SGLang)",
    )
    ap.add_argument("--stream-interval", type=int, default=1, help="tokens per /generate chunk (default 1)")
    engine_flags = _engine_flags(ap.add_argument_group("engine"))
    lim = ap.add_argument_group("limits")
    lim.add_argument(
        "--max-queued-requests",
        type=int,
        default=1024,
        help="requests accepted beyond --max-num-seqs before answering 503 (default 1024)",
    )
    lim.add_argument(
        "--max-request-bytes", type=int, default=16 << 20, help="413 above this (default 16 MiB)"
    )
    lim.add_argument(
        "--shutdown-timeout",
        type=_seconds,
        default=30.0,
        help="seconds running requests get to finish after SIGTERM before they are aborted (default 30)",
    )
    args = ap.parse_args(argv)
    for name in ("stream_interval", "max_queued_requests", "max_request_bytes"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if not 0 <= args.port < 65536:
        ap.error(f"--port must be in [0, 65535], got {args.port}")
    try:
        args.engine = EngineConfig(
            model_path=args.model_path,
            **{f.name: tuple(v) if isinstance(v := getattr(args, f.name), list) else v for f in engine_flags},
        )
    except ValueError as e:
        message = str(e)
        for f in engine_flags:  # whole words: the field device must not rename devices
            message = re.sub(rf"\b{f.name}\b", _flag_name(f), message)
        ap.error(message)
    return args


# ----------------------------------------------------------------------------- process


async def serve(args: argparse.Namespace) -> None:
    from gptoss.dp_engine import ReplicaStartError, open_engine

    config: EngineConfig = args.engine
    if config.model_path is None:
        from gptoss.default import default_checkpoint

        config = dataclasses.replace(config, model_path=default_checkpoint())
    model_path = config.model_path.resolve()
    if not (model_path / "config.json").is_file():
        raise SystemExit(f"gptoss.serve: {model_path} is not a checkpoint directory (no config.json)")
    try:
        async with open_engine(dataclasses.replace(config, model_path=model_path)) as engine:
            await _serve_engine(engine, args, model_path)
    except ReplicaStartError as e:  # one line, as the harness says it; the replica's stderr has more
        raise SystemExit(f"gptoss.serve: {e}") from None
    print("gptoss.serve: stopped", flush=True)


async def _serve_engine(engine: Any, args: argparse.Namespace, model_path: Path) -> None:
    """Listen until SIGTERM or SIGINT, then drain (the caller stops the engine)."""
    server = Server(engine, args, model_path, engine.vocab_size)
    # handler_cancellation: a client that goes away cancels its handler, which aborts its request.
    runner = web.AppRunner(
        build_app(server), handler_cancellation=True, access_log=None, shutdown_timeout=CLOSE_TIMEOUT_S
    )
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    host, port = site._server.sockets[0].getsockname()[:2]
    replicas = f", {engine.num_replicas} replicas" if engine.num_replicas > 1 else ""
    print(
        f"gptoss.serve: listening on http://{host}:{port} (model {server.model}, "
        f"max_model_len {engine.max_model_len}{replicas})",
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await drain(server, args.shutdown_timeout)
    await runner.cleanup()


async def drain(server: Server, timeout: float) -> None:
    """New requests get 503; running ones get `timeout` s to finish, then are aborted, so each
    stream still ends with an abort event and [DONE]. Returns within timeout + ABORT_GRACE_S."""
    server.draining = True  # /health 503, new requests 503
    if server.in_flight:
        log.info("draining %d requests (up to %g s)", server.in_flight, timeout)
    try:
        await asyncio.wait_for(server.idle.wait(), timeout)
        return
    except TimeoutError:  # noqa: S110 - still running after `timeout`: aborted below, each with its reason
        pass
    log.info("aborting %d requests still running after %g s", server.in_flight, timeout)
    server.abort_all(f"the server shut down: the request was still running {timeout:g} s after SIGTERM")
    try:
        await asyncio.wait_for(server.idle.wait(), ABORT_GRACE_S)
    except TimeoutError:
        log.warning("%d requests did not end after their abort; closing their connections", server.in_flight)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr
    )
    import uvloop

    uvloop.run(serve(args))

"""Serve the gptoss engine over HTTP: SGLang's native /generate and OpenAI's /v1/completions.

    python -m gptoss.serve [--model-path DIR] [--host 127.0.0.1] [--port 30000]
                           [--incremental-streaming-output] [--stream-interval N] ...

Streams are SSE (`data: {json}` ... `data: [DONE]`). /generate repeats all output ids in every chunk
unless --incremental-streaming-output, exactly as SGLang does. Binds 127.0.0.1 unless --host says
otherwise; bodies over --max-request-bytes get 413, prompts that do not fit the context 400, and
more than --max-num-seqs + --max-queued-requests requests at once 503. SIGTERM or SIGINT: stop
accepting, let running requests finish for up to --shutdown-timeout seconds, abort the rest, exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from pathlib import Path

from aiohttp import web

from gptoss.serve.app import Server, build_app

log = logging.getLogger("gptoss.serve")


# ----------------------------------------------------------------------------- process


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m gptoss.serve", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", type=Path, default=None,
                    help="checkpoint directory (default: the tiny random checkpoint, made once and cached)")
    ap.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    ap.add_argument("--port", type=int, default=30000, help="port (default 30000, SGLang's; 0 picks a free one)")
    ap.add_argument("--served-model-name", default=None, help="`model` of the OpenAI API (default: the directory name)")
    ap.add_argument("--incremental-streaming-output", action="store_true",
                    help="/generate chunks carry only new ids (default: all ids so far, as SGLang)")
    ap.add_argument("--stream-interval", type=int, default=1, help="tokens per /generate chunk (default 1)")
    e = ap.add_argument_group("engine")
    e.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    e.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    e.add_argument("--max-num-seqs", type=int, default=256)
    e.add_argument("--max-num-batched-tokens", type=int, default=8192)
    e.add_argument("--max-model-len", type=int, default=None)
    e.add_argument("--kv-cache-tokens", type=int, default=None)
    e.add_argument("--seed", type=int, default=0)
    lim = ap.add_argument_group("limits")
    lim.add_argument("--max-queued-requests", type=int, default=1024,
                     help="requests accepted beyond --max-num-seqs before answering 503 (default 1024)")
    lim.add_argument("--max-request-bytes", type=int, default=16 << 20, help="413 above this (default 16 MiB)")
    lim.add_argument("--shutdown-timeout", type=float, default=30.0,
                     help="seconds running requests get to finish after SIGTERM (default 30)")
    args = ap.parse_args(argv)
    for name in ("stream_interval", "max_num_seqs", "max_queued_requests", "max_request_bytes"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def _vocab_size(model_path: Path) -> int:
    cfg = json.loads((model_path / "config.json").read_text())
    return int(cfg["vocab_size"])


async def serve(args: argparse.Namespace) -> None:
    from gptoss.engine import AsyncEngine, EngineConfig

    if args.model_path is None:
        from gptoss.default import default_checkpoint

        args.model_path = default_checkpoint()
    model_path = args.model_path.resolve()
    if not (model_path / "config.json").is_file():
        raise SystemExit(f"gptoss.serve: {model_path} is not a checkpoint directory (no config.json)")
    cfg = EngineConfig(model_path=model_path, device=args.device, dtype=args.dtype, max_num_seqs=args.max_num_seqs,
                       max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
                       kv_cache_tokens=args.kv_cache_tokens, seed=args.seed)
    async with AsyncEngine(cfg) as engine:
        server = Server(engine, args, model_path, _vocab_size(model_path))
        # On shutdown aiohttp stops listening, lets running handlers finish for shutdown_timeout
        # seconds, then cancels them: each cancelled handler aborts its request in the engine.
        runner = web.AppRunner(build_app(server), handler_cancellation=True, access_log=None,
                               shutdown_timeout=args.shutdown_timeout)
        await runner.setup()
        site = web.TCPSite(runner, args.host, args.port)
        await site.start()
        host, port = site._server.sockets[0].getsockname()[:2]
        print(f"gptoss.serve: listening on http://{host}:{port} (model {server.model}, "
              f"max_model_len {engine.max_model_len})", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        server.draining = True  # /health 503, new requests 503
        if server.in_flight:
            log.info("draining %d requests (up to %g s)", server.in_flight, args.shutdown_timeout)
        await runner.cleanup()
    print("gptoss.serve: stopped", flush=True)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        stream=sys.stderr)
    import uvloop

    uvloop.run(serve(args))


if __name__ == "__main__":
    main()

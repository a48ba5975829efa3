"""How fast the sglang client takes streamed tokens, and the latency it adds (ours vs MLCommons reference).

A local SGLang-shaped server (uvloop, chunks pre-encoded once) runs on one core and each client on
another (taskset). Two phases per client and output mode:
  burst: every response is written at once; tokens/s the client processes on its one core;
  paced: each stream gets one chunk per --paced-interval-ms; per-token lateness = arrival time minus
         the time the server scheduled that token (from the request's send time): the added latency.
With --reference-checkout PATH (a checkout of github.com/mlcommons/inference) the reference's
language/gpt-oss-120b/backends/sglang_backend.py runs against the same server in the same run.

    python bench/client_stream.py [--reference-checkout /tmp/mlcommons-inference]

This file is the driver, its table and the flags; the server and the clients are in client_stream_procs.py.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

# Run as a script (by hand and by drive()): its own folder is sys.path[0].
from client_stream_procs import run_client, serve

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- driver


def client_cmd(args: argparse.Namespace, url: str, impl: str, phase: str, mode: str) -> list[str]:
    burst = phase == "burst"
    return [
        "taskset",
        "-c",
        str(args.client_core),
        sys.executable,
        __file__,
        "--role",
        "client",
        "--impl",
        impl,
        "--url",
        url,
        "--phase",
        phase,
        "--mode",
        mode,
        "--tokens",
        str(args.tokens if burst else args.paced_tokens),
        "--concurrency",
        str(args.concurrency if burst else args.paced_streams),
        "--seconds",
        str(args.seconds if burst else args.paced_seconds),
        "--paced-interval-ms",
        str(args.paced_interval_ms),
        "--checkout",
        str(args.reference_checkout or ""),
    ]


def drive(args: argparse.Namespace) -> None:
    server = subprocess.Popen(
        [
            "taskset",
            "-c",
            str(args.server_core),
            sys.executable,
            __file__,
            "--role",
            "server",
            "--paced-interval-ms",
            str(args.paced_interval_ms),
            "--stream-interval",
            str(args.stream_interval),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        line = server.stdout.readline()
        if not line.startswith("PORT "):
            raise SystemExit(f"bench server did not start: {line!r}")
        url = f"http://127.0.0.1:{line.split()[1]}"
        impls = ["raw", "ours"] + (["reference"] if args.reference_checkout else [])
        rows = []
        for mode in args.modes.split(","):
            for impl in impls:
                res = {}
                for phase in ("burst", "paced") if impl != "raw" else ("burst",):
                    proc = subprocess.run(
                        client_cmd(args, url, impl, phase, mode),
                        capture_output=True,
                        text=True,
                        cwd=ROOT,
                        env={**os.environ, "PYTHONPATH": str(ROOT)},
                    )
                    if proc.returncode:
                        raise SystemExit(f"{impl} {phase} {mode} failed:\n{proc.stderr[-3000:]}")
                    res[phase] = json.loads(proc.stdout.strip().splitlines()[-1])
                rows.append((mode, impl, res))
                print(f"  done: {impl} {mode}: {res}", file=sys.stderr, flush=True)
    finally:
        server.kill()
        server.wait()
    report(args, rows)


def report(args: argparse.Namespace, rows: list) -> None:
    print(
        f"\nsglang client streaming, {args.tokens} tokens/request, stream_interval {args.stream_interval}, "
        f"client on core {args.client_core}, server on core {args.server_core}"
    )
    print(
        f"paced: {args.paced_streams} streams x 1 chunk/{args.paced_interval_ms:g} ms, "
        f"{args.paced_tokens} tokens/request\n"
    )
    # tokens per client CPU-second = what one fully used core sustains; it is robust to other load on
    # the machine, unlike wall tokens/s, which is also shown (with the share of a core the client got).
    print(
        "| output ids | client | tokens / client CPU-s | wall tokens/s | client CPU | bad requests "
        "| paced p50 added | paced p99 added |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    by = {}
    names = {
        "raw": "aiohttp read, no parsing (floor)",
        "ours": "ours (backends/sglang.py)",
        "reference": "MLCommons reference",
    }
    for mode, impl, res in rows:
        b, p = res["burst"], res.get("paced")
        per_cpu = b["tokens_per_s"] / b["cpu_util"]
        by[(mode, impl)] = per_cpu
        paced = f"{p['p50_ms']:.2f} ms | {p['p99_ms']:.2f} ms" if p else "- | -"
        bad = b["bad"] + (p["bad"] if p else 0)
        print(
            f"| {mode} | {names[impl]} | {per_cpu:,.0f} | {b['tokens_per_s']:,.0f} |"
            f" {100 * b['cpu_util']:.0f}% | "
            f"{bad} | {paced} |"
        )
    for mode in args.modes.split(","):
        if (mode, "reference") in by:
            print(
                f"\n{mode}: ours / reference = {by[(mode, 'ours')] / by[(mode, 'reference')]:.1f}x "
                "tokens per client CPU-second"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reference-checkout", type=Path, help="checkout of the mlcommons/inference repo")
    ap.add_argument("--tokens", type=int, default=1024, help="tokens per request, burst phase (default 1024)")
    ap.add_argument("--concurrency", type=int, default=64, help="streams at once, burst phase (default 64)")
    ap.add_argument("--seconds", type=float, default=8.0, help="burst phase length per client (default 8)")
    ap.add_argument("--paced-streams", type=int, default=32)
    ap.add_argument("--paced-interval-ms", type=float, default=2.0)
    ap.add_argument("--paced-tokens", type=int, default=256)
    ap.add_argument("--paced-seconds", type=float, default=5.0)
    ap.add_argument("--stream-interval", type=int, default=1, help="tokens per chunk (SGLang default 1)")
    ap.add_argument("--modes", default="cumulative,incremental", help="output_ids modes to run")
    ap.add_argument("--client-core", type=int, default=0)
    ap.add_argument("--server-core", type=int, default=1)
    # internal: the processes the driver starts
    ap.add_argument("--role", choices=("drive", "server", "client"), default="drive", help=argparse.SUPPRESS)
    ap.add_argument("--impl", choices=("raw", "ours", "reference"), help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--phase", choices=("burst", "paced"), help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=("cumulative", "incremental"), help=argparse.SUPPRESS)
    ap.add_argument("--checkout", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.reference_checkout and not (args.reference_checkout / "language/gpt-oss-120b/backends").is_dir():
        ap.error(
            f"{args.reference_checkout} has no language/gpt-oss-120b/backends: not an"
            f" mlcommons/inference checkout"
        )
    if args.role == "server":
        serve(0, args.paced_interval_ms, args.stream_interval)
    elif args.role == "client":
        import uvloop

        print(json.dumps(uvloop.run(run_client(args))))
    else:
        drive(args)


if __name__ == "__main__":
    main()

"""Server/Interactive QPS sweep: one LoadGen run per target QPS on one started backend, up to the
first INVALID run, and the highest VALID QPS (a user's search for their system's Server figure)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rich.console import Console
from rich.table import Table

import backends
from backends.base import Backend
from harness.config import RunConfig
from harness.loop import shared_loop
from harness.record import write_json
from harness.runner import (
    EXIT_FAILED_QUERIES,
    EXIT_INVALID,
    EXIT_OK,
    attach,
    finish,
    prepare,
    run_loadgen,
)
from harness.warmup import warm_up

FILE_NAME = "qps_sweep.json"


def point_config(cfg: RunConfig, qps: float) -> RunConfig:
    """The run at one QPS: its own OUTPUT_DIR/qps_<Q>, so every run keeps its LoadGen logs."""
    return replace(cfg, target_qps=qps, output_dir=cfg.output_dir / f"qps_{qps:g}", qps_sweep=())


def run_sweep(cfg: RunConfig, console: Console | None = None) -> int:
    """Runs cfg.qps_sweep in order; returns EXIT_OK when some QPS was VALID and no query failed."""
    console = console or Console(highlight=False)
    loop = shared_loop()
    points: list[dict[str, Any]] = []
    first = prepare(point_config(cfg, cfg.qps_sweep[0]), console)
    console.print(f"starting backend '{cfg.backend}' once for {len(cfg.qps_sweep)} target QPS values ...")
    backend: Backend = loop.run(backends.module(cfg.backend).create(first.cfg).__aenter__())
    base = replace(first.cfg, output_dir=cfg.output_dir)  # with the model path the first check resolved
    interrupted: int | None = None
    try:
        for qps in cfg.qps_sweep:
            console.rule(f"target QPS {qps:g}")
            r = first if not points else prepare(point_config(base, qps), console)
            attach(r, backend)
            if not points:  # once per started backend
                warm_up(r, backend, loop)
            sut, signum = run_loadgen(r, backend, loop)
            code = finish(r, sut, signum)
            result = r.record.get("result", {})
            points.append(
                {
                    "target_qps": qps,
                    "validity": result.get("validity"),
                    "invalid_reason": result.get("invalid_reason"),
                    "tokens_per_s": result.get("tokens_per_s"),
                    "ttft_p99_ms": _ms(result.get("ttft_p99_ns")),
                    "tpot_p99_ms": _ms(result.get("tpot_p99_ns")),
                    "failed": sut.failed,
                    "exit_code": code,
                    "log_dir": str(r.cfg.log_dir),
                }
            )
            if signum is not None:
                interrupted = code
                break
            if result.get("validity") != "VALID":
                break  # ascending: a higher target fails the same limits
    finally:
        loop.run(backend.__aexit__(None, None, None))
    best = max((p for p in points if p["validity"] == "VALID" and not p["failed"]), key=_qps, default=None)
    write_json(
        cfg.output_dir / FILE_NAME,
        {
            "scenario": cfg.scenario,
            "backend": cfg.backend,
            "warmup": first.record.get("warmup"),
            "points": points,
            "highest_valid_qps": best and _qps(best),
        },
    )
    _print(console, points, best, cfg)
    if interrupted is not None:
        return interrupted
    if any(p["failed"] for p in points):
        return EXIT_FAILED_QUERIES
    return EXIT_OK if best else EXIT_INVALID


def _qps(point: dict[str, Any]) -> float:
    return point["target_qps"]


def _ms(ns: int | None) -> float | None:
    return None if ns is None else ns / 1e6


def _print(
    console: Console, points: list[dict[str, Any]], best: dict[str, Any] | None, cfg: RunConfig
) -> None:
    table = Table(title=f"{cfg.scenario} QPS sweep, backend {cfg.backend}")
    for name in ("target QPS", "result", "tokens/s", "TTFT p99 ms", "TPOT p99 ms", "failed"):
        table.add_column(name, justify="right")
    for p in points:
        table.add_row(
            f"{p['target_qps']:g}",
            p["validity"] or "-",
            _fmt(p["tokens_per_s"], ".1f"),
            _fmt(p["ttft_p99_ms"], ".1f"),
            _fmt(p["tpot_p99_ms"], ".2f"),
            str(p["failed"]),
        )
    console.print(table)
    if best is None:
        console.print(f"[bold red]no target QPS was VALID[/] (see {cfg.output_dir / FILE_NAME})")
    else:
        console.print(f"highest VALID target QPS: [bold]{_qps(best):g}[/] ({cfg.output_dir / FILE_NAME})")


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)

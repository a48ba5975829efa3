"""Read LoadGen's detail log and print the end-of-run summary and failure report."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.markup import escape
from rich.table import Table

_PREFIX = ":::MLLOG "


@dataclass(frozen=True, slots=True)
class DetailLog:
    values: dict[str, Any]  # key -> last value logged
    errors: tuple[str, ...]  # messages LoadGen logged as errors, in order
    warnings: tuple[str, ...]


def read_detail(log_dir: Path) -> DetailLog:
    path = Path(log_dir) / "mlperf_log_detail.txt"
    values: dict[str, Any] = {}
    errors: list[str] = []
    warnings: list[str] = []
    with open(path, "rb") as f:
        for line in f:
            if not line.startswith(_PREFIX.encode()):
                continue
            entry = orjson.loads(line[len(_PREFIX) :])
            values[entry["key"]] = entry["value"]
            meta = entry.get("metadata", {})
            if meta.get("is_error"):
                errors.append(str(entry["value"]))
            elif meta.get("is_warning"):
                warnings.append(str(entry["value"]))
    return DetailLog(values, tuple(errors), tuple(warnings))


@dataclass(frozen=True, slots=True)
class Result:
    """The headline numbers of one LoadGen run (None where LoadGen did not report them)."""

    scenario: str  # "Offline" | "Server"
    accuracy: bool
    validity: str | None  # "VALID" | "INVALID"; None in accuracy mode
    invalid_reason: str | None
    samples_per_s: float | None
    tokens_per_s: float | None
    ttft_p50_ns: int | None
    ttft_p99_ns: int | None
    tpot_p50_ns: int | None
    tpot_p99_ns: int | None
    ttft_limit_ns: int | None
    tpot_limit_ns: int | None
    loadgen_errors: tuple[str, ...]
    # The percentile LoadGen judged the limits at (0.99 but in the embedded default's smoke run),
    # and the TTFT/TPOT there.
    target_percentile: float | None = None
    ttft_target_ns: int | None = None
    tpot_target_ns: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


def summarize(
    log: DetailLog, *, scenario: str, accuracy: bool, ttft_limit_ns: int, tpot_limit_ns: int
) -> Result:
    v = log.values
    server = scenario == "Server"
    validity = None if accuracy else v.get("result_validity")
    reason = None
    if validity == "INVALID":
        parts = [str(v.get("result_invalid_reason", "")).strip()]
        if v.get("early_stopping_met") is False:
            for key in ("early_stopping_ttft_result", "early_stopping_tpot_result", "early_stopping_result"):
                text = str(v.get(key, "")).strip()
                if text and "Run successful" not in text:
                    parts.append(f"early stopping: {text}")
        reason = " ".join(p for p in parts if p) or "see mlperf_log_detail.txt"
    pct = v.get("effective_target_latency_percentile") if server else None
    at = f"{pct * 100:.2f}" if isinstance(pct, int | float) else None
    return Result(
        scenario=scenario,
        accuracy=accuracy,
        validity=validity,
        invalid_reason=reason,
        samples_per_s=v.get("result_completed_samples_per_sec" if server else "result_samples_per_second"),
        tokens_per_s=v.get("result_completed_tokens_per_second" if server else "result_tokens_per_second"),
        ttft_p50_ns=v.get("result_first_token_50.00_percentile_latency_ns"),
        ttft_p99_ns=v.get("result_first_token_99.00_percentile_latency_ns"),
        tpot_p50_ns=v.get("result_time_per_output_token_50.00_percentile_ns"),
        tpot_p99_ns=v.get("result_time_per_output_token_99.00_percentile_ns"),
        ttft_limit_ns=ttft_limit_ns if server else None,
        tpot_limit_ns=tpot_limit_ns if server else None,
        loadgen_errors=log.errors,
        target_percentile=pct,
        ttft_target_ns=v.get(f"result_first_token_{at}_percentile_latency_ns") if at else None,
        tpot_target_ns=v.get(f"result_time_per_output_token_{at}_percentile_ns") if at else None,
    )


def _ms(ns: int | None) -> str:
    return "n/a" if ns is None else f"{ns / 1e6:,.1f} ms"


def _rate(x: float | None) -> str:
    return "n/a" if x is None else f"{x:,.2f}"


def print_summary(
    console: Console,
    result: Result,
    *,
    completed: int,
    output_tokens: int,
    failed: int,
    log_dir: Path,
) -> None:
    title = f"{result.scenario} {'accuracy' if result.accuracy else 'performance'} run"
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("limit / note")
    if result.validity is not None:
        style = "bold green" if result.validity == "VALID" else "bold red"
        table.add_row("result", f"[{style}]{result.validity}[/]", escape(result.invalid_reason or ""))
    if not result.accuracy:  # accuracy mode issues every sample once, unpaced: no rates
        table.add_row("samples/s", _rate(result.samples_per_s), "LoadGen")
        table.add_row("output tokens/s", _rate(result.tokens_per_s), "LoadGen")
    if result.scenario == "Server" and not result.accuracy:
        judged = result.target_percentile is not None and result.target_percentile != 0.99
        pct = f"p{result.target_percentile * 100:g}" if judged else "p99"
        for name, p50, p99, at, limit in (
            ("TTFT", result.ttft_p50_ns, result.ttft_p99_ns, result.ttft_target_ns, result.ttft_limit_ns),
            ("TPOT", result.tpot_p50_ns, result.tpot_p99_ns, result.tpot_target_ns, result.tpot_limit_ns),
        ):
            value = at if judged else p99
            ok = value is not None and limit is not None and value <= limit
            mark = "[green]ok[/]" if ok else "[red]over[/]"
            shown = f"{_ms(p50)} / {_ms(at)} / {_ms(p99)}" if judged else f"{_ms(p50)} / {_ms(p99)}"
            label = f"{name} p50 / {pct} / p99" if judged else f"{name} p50 / p99"
            table.add_row(label, shown, f"{pct} <= {_ms(limit)} {mark}")
    table.add_row("queries completed", f"{completed:,}", "")
    table.add_row("output tokens", f"{output_tokens:,}", "")
    fail_style = "bold red" if failed else "green"
    table.add_row("failed queries", f"[{fail_style}]{failed:,}[/]", "")
    console.print(table)
    if result.loadgen_errors:
        counts = Counter(result.loadgen_errors)
        console.print(f"[yellow]LoadGen logged {len(result.loadgen_errors)} error(s):[/]")
        for message, n in counts.most_common(5):
            console.print(f"  {n} x {escape(message)}")
    console.print(f"LoadGen logs: {log_dir}")


def print_failures(
    console: Console, failures: Counter[str], examples: dict[str, list[int]], total: int
) -> None:
    failed = sum(failures.values())
    if not failed:
        return
    console.print(
        f"[bold red]{failed} of {total} queries failed[/] (completed with the tokens received before the "
        "failure):"
    )
    for reason, n in failures.most_common(10):
        idx = ", ".join(map(str, examples.get(reason, [])))
        more = ", ..." if n > len(examples.get(reason, [])) else ""
        # A reason quotes a server or the OS ("[Errno 104] ..."): text, never markup.
        console.print(f"  {n} x {escape(reason)}  [dim](qsl_idx {idx}{more})[/]", soft_wrap=True)
    if len(failures) > 10:
        console.print(f"  ... and {len(failures) - 10} other reasons (run.json lists them all)")

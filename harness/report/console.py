"""The end-of-run summary table and failure report on the console (rich)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness.report.detail import Result


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

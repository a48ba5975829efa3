"""Print an evaluation result: per-dataset table, exact_match, PASS/FAIL."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def print_report(result: dict, console: Console | None = None) -> None:
    console = console or Console(highlight=False)
    table = Table(title="gpt-oss accuracy", title_justify="left")
    table.add_column("dataset", no_wrap=True, min_width=max(map(len, result["per_dataset"]), default=7))
    for column in ("correct", "total", "repeats", "accuracy %", "score", "max score"):
        table.add_column(column, justify="right")
    for name, d in result["per_dataset"].items():
        table.add_row(
            name,
            str(d["correct"]),
            str(d["total"]),
            str(d["repeats"]),
            f"{d['accuracy']:.2f}",
            f"{d['component_score']:.2f}",
            f"{d['max_component_score']:.2f}",
        )
    console.print(table)
    counts = result["counts"]
    console.print(
        f"samples: {counts['log_entries']} of {counts['dataset_rows']} rows; "
        f"mean output {counts['mean_output_tokens']:.1f} tokens; "
        f"{counts['without_final_channel']} without a final channel"
    )
    for problem in result["problems"]:
        console.print(f"[bold red]problem:[/] {problem}")
    if result.get("sandbox_isolation") == "fallback":
        console.print(
            "[bold yellow]sandbox: fallback[/] (no Linux namespaces here): generated code ran behind rlimits "
            "and Python audit hooks only, and could read the host's files"
        )
    score = result["exact_match"]
    if score is None:
        console.print("exact_match: not computed")
    else:
        # The submission checker and TEST07's verifier read this exact line.
        console.print(f"'exact_match': {score:.3f}", markup=False)
    verdict = "[bold green]PASS[/]" if result["passed"] else "[bold red]FAIL[/]"
    console.print(f"{verdict} (threshold {result['threshold']:.2f})")

"""report.md: the verdict and summary of each run, the comparison table with ratios to the first
run, and the plots."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from harness.report.runs import Run


def _ns_ms(ns: int | None) -> float | None:
    return None if ns is None else ns / 1e6


@dataclass(frozen=True, slots=True)
class Metric:
    name: str
    value: Callable[[Run], float | int | None]
    fmt: str  # format spec for a value


METRICS = (
    Metric("output tokens/s", lambda r: r.result.tokens_per_s, ",.2f"),
    Metric("samples/s", lambda r: r.result.samples_per_s, ",.2f"),
    Metric("TTFT p50 (ms)", lambda r: _ns_ms(r.result.ttft_p50_ns), ",.2f"),
    Metric("TTFT p99 (ms)", lambda r: _ns_ms(r.result.ttft_p99_ns), ",.2f"),
    Metric("TPOT p50 (ms)", lambda r: _ns_ms(r.result.tpot_p50_ns), ",.2f"),
    Metric("TPOT p99 (ms)", lambda r: _ns_ms(r.result.tpot_p99_ns), ",.2f"),
    Metric("failed queries", lambda r: r.failed, ",d"),
)


@dataclass(frozen=True, slots=True)
class Row:
    metric: Metric
    values: tuple[float | int | None, ...]
    ratios: tuple[float | None, ...]  # value / the first run's value (None where undefined)


def compare(runs: list[Run]) -> list[Row]:
    rows = []
    for m in METRICS:
        values = tuple(m.value(r) for r in runs)
        base = values[0]
        ratios = tuple(None if v is None or base is None or base == 0 else v / base for v in values)
        rows.append(Row(m, values, ratios))
    return rows


def _fmt(value: float | int | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def verdict_line(run: Run) -> str:
    r = run.result
    if r.accuracy:
        evaluation = run.record.get("evaluation") or {}
        if "passed" in evaluation:
            score = evaluation.get("exact_match")
            shown = "n/a" if score is None else f"{score:.3f}"
            word = "PASS" if evaluation["passed"] else "FAIL"
            return f"**accuracy {word}** (exact_match {shown}, threshold {evaluation.get('threshold')})"
        return "accuracy run (not scored here)"
    validity = (
        r.validity or (run.verdict.result if run.verdict else None) or "no result (LoadGen did not finish)"
    )
    text = f"**{validity}**"
    if r.invalid_reason:
        text += f": {r.invalid_reason}"
    return text


def summary_table(run: Run) -> list[str]:
    r = run.result
    lines = ["| metric | value | limit / note |", "|---|---:|---|"]
    if not r.accuracy:
        lines.append(f"| samples/s | {_fmt(r.samples_per_s, ',.2f')} | LoadGen |")
        lines.append(f"| output tokens/s | {_fmt(r.tokens_per_s, ',.2f')} | LoadGen |")
    if r.scenario == "Server" and not r.accuracy:
        pct = r.target_percentile or 0.99
        label = f"p{pct * 100:g}"
        for name, p50, p99, at, limit in (
            ("TTFT", r.ttft_p50_ns, r.ttft_p99_ns, r.ttft_target_ns, r.ttft_limit_ns),
            ("TPOT", r.tpot_p50_ns, r.tpot_p99_ns, r.tpot_target_ns, r.tpot_limit_ns),
        ):
            judged = at if pct != 0.99 else p99
            ok = judged is not None and limit is not None and judged <= limit
            note = f"{label} <= {_fmt(_ns_ms(limit), ',.1f')} ms: {'ok' if ok else 'over'}"
            lines.append(f"| {name} p50 (ms) | {_fmt(_ns_ms(p50), ',.2f')} | |")
            if pct != 0.99:
                lines.append(f"| {name} {label} (ms) | {_fmt(_ns_ms(at), ',.2f')} | {note} |")
                note = ""
            lines.append(f"| {name} p99 (ms) | {_fmt(_ns_ms(p99), ',.2f')} | {note} |")
    queries = run.record.get("queries", {})
    if queries:
        lines.append(f"| queries completed | {queries.get('completed', 0):,} | |")
        lines.append(f"| output tokens | {queries.get('output_tokens', 0):,} | |")
    failed = run.failed
    lines.append(f"| failed queries | {_fmt(failed, ',d')} | {'see run.json' if failed else ''} |")
    return lines


def _run_section(run: Run, heading: str) -> list[str]:
    out = [f"{heading} {run.label}", ""]
    rec = run.record
    facts = [f"{run.scenario} {run.mode}", f"`{run.log_dir}`"]
    if backend := rec.get("config", {}).get("backend"):
        facts.append(f"backend {backend}")
    if started := rec.get("started_at"):
        facts.append(f"started {started}")
    if commit := rec.get("git_commit"):
        facts.append(f"commit {commit[:12]}")
    out += [" · ".join(facts), ""]
    if command := rec.get("command"):
        out += [f"Command: `{command}`", ""]
    out += [f"Verdict: {verdict_line(run)}", ""]
    if run.verdict and run.verdict.checks:
        checks = "; ".join(f"{name}: {value}" for name, value in run.verdict.checks)
        out += [f"LoadGen's checks: {_escape(checks)}", ""]
    if run.verdict and run.verdict.recommendations:
        out += ["LoadGen's recommendations:", "", "```", run.verdict.recommendations, "```", ""]
    out += summary_table(run)
    for reason, n in sorted(rec.get("failures", {}).get("reasons", {}).items(), key=lambda kv: -kv[1]):
        if n:
            out.append(f"- {n} x {_escape(reason)}")
    return out + [""]


def comparison_table(runs: list[Run]) -> list[str]:
    head = "| metric | " + " | ".join(_escape(r.label) for r in runs) + " |"
    lines = [head, "|---|" + "---:|" * len(runs)]
    lines.append("| result | " + " | ".join(r.result.validity or "n/a" for r in runs) + " |")
    for row in compare(runs):
        cells = []
        for k, (v, ratio) in enumerate(zip(row.values, row.ratios, strict=True)):
            cell = _fmt(v, row.metric.fmt)
            if k and ratio is not None:
                cell += f" ({ratio:.3f}x)"
            cells.append(cell)
        lines.append(f"| {row.metric.name} | " + " | ".join(cells) + " |")
    return lines


def render(runs: list[Run], plots: list[tuple[str, str]]) -> str:
    if len(runs) == 1:
        out = [f"# Run report: {runs[0].label}", ""]
        out += _run_section(runs[0], "##")[2:]
    else:
        out = [f"# Run comparison: {len(runs)} runs", "", "Ratios are to the first run.", ""]
        out += comparison_table(runs) + [""]
    out += ["## Plots", ""]
    for name, caption in plots:
        out += [f"### {caption}", "", f"![{caption}]({name})", ""]
    out.append(
        "Latency distributions and the time series are the SUT's per-query records (queries.parquet); "
        "the numbers in the tables are LoadGen's."
    )
    if any(r.scenario == "offline" for r in runs):
        out += [
            "",
            "Offline: a backend may hand over a query's output in one piece (the gptoss engine and vLLM's "
            "FINAL_ONLY do), so its first token arrives with its last: TTFT is then the whole latency, TPOT "
            "near 0 and the tokens/s curve has one spike per batch of completions.",
        ]
    if len(runs) > 1:
        out += ["", "## Runs", ""]
        for run in runs:
            out += _run_section(run, "###")
    return "\n".join(out).rstrip() + "\n"

"""The report's PNGs (matplotlib, Agg canvas): latency CDFs against the limits, output tokens/s and
queries in flight over time, output lengths. Several runs are overlaid, one colour each."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from harness.report.runs import Run
from harness.report.series import cdf, in_flight, token_rate

DPI = 110
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")
LIMIT_COLOR = "#d62728"


def _color(i: int) -> str:
    return COLORS[i % len(COLORS)]


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)  # Agg, whatever backend pyplot would pick: no display needed
    fig.savefig(path, dpi=DPI)
    return path


def _no_data(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="gray", wrap=True)


def _pct_label(p: float | None) -> str:
    return f"p{(p or 0.99) * 100:g}"


def plot_latency(runs: list[Run], path: Path) -> Path:
    """TTFT and TPOT CDFs (SUT-measured, per query) with each scenario's limit at its percentile."""
    fig = Figure(figsize=(12, 4.8), layout="constrained")
    axes = fig.subplots(1, 2)
    specs = (
        ("TTFT", "ttft_s", "time to first token (ms)", 0),
        ("TPOT", "tpot_s", "time per output token (ms)", 1),
    )
    for name, column, xlabel, k in specs:
        ax = axes[k]
        drawn_limits: set[tuple[int, float]] = set()
        plotted = False
        span: list[float] = []  # smallest positive value and largest value or limit, in ms
        for i, run in enumerate(runs):
            if run.queries is None:
                continue
            x, y = cdf(run.queries[column].to_numpy(dtype=np.float64) * 1e3)
            if not len(x):
                continue
            plotted = True
            span += [float(x[x > 0].min()) if (x > 0).any() else float(x.max()), float(x.max())]
            ax.step(x, y, where="post", color=_color(i), label=f"{run.label} ({len(x):,} queries)")
            r = run.result
            limit = run.limits_ns[k]
            pct = r.target_percentile or 0.99
            at = (r.ttft_target_ns, r.tpot_target_ns)[k] or (r.ttft_p99_ns, r.tpot_p99_ns)[k]
            if limit and (limit, pct) not in drawn_limits:
                drawn_limits.add((limit, pct))
                span.append(limit / 1e6)
                ax.axvline(
                    limit / 1e6,
                    color=LIMIT_COLOR,
                    linestyle="--",
                    linewidth=1.5,
                    label=f"{run.scenario} limit: {_pct_label(pct)} <= {limit / 1e6:,.0f} ms",
                )
                ax.axhline(pct, color=LIMIT_COLOR, linestyle=":", linewidth=1)
                ax.annotate(
                    _pct_label(pct),
                    (0, pct),
                    xycoords=("axes fraction", "data"),
                    xytext=(3, 3),
                    textcoords="offset points",
                    color=LIMIT_COLOR,
                    fontsize=9,
                )
            if at is not None and limit:
                ax.plot(
                    [at / 1e6],
                    [pct],
                    marker="x",
                    markersize=9,
                    mew=2,
                    color=_color(i),
                    linestyle="none",
                    label=f"LoadGen {_pct_label(pct)}: {at / 1e6:,.1f} ms",
                )
        if not plotted:
            _no_data(ax, "no per-query records (queries.parquet)")
        scenarios = {r.scenario for r in runs}
        no_limit = " (Offline: no latency limit)" if scenarios == {"offline"} else ""
        ax.set_title(f"{name} distribution{no_limit}")
        # Values far below the limit (or spread over decades) would hug the axis on a linear scale.
        log = len(span) > 1 and min(span) > 0 and max(span) / min(span) > 100
        if log:
            ax.set_xscale("log")
        else:
            ax.set_xlim(left=0)
        ax.set_xlabel(xlabel + (", log scale" if log else ""))
        ax.set_ylabel("fraction of queries")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        if plotted:
            ax.legend(loc="lower right", fontsize=8)
    return _save(fig, path)


def plot_timeline(runs: list[Run], path: Path) -> Path:
    """Output tokens/s (tokens spread over each query's first-token..completion span) and queries in
    flight, against seconds since the run started."""
    fig = Figure(figsize=(12, 6.4), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    plotted = False
    for i, run in enumerate(runs):
        q = run.queries
        if q is None or not len(q):
            continue
        plotted = True
        first = q["first_token_s"].to_numpy(dtype=np.float64)
        done = q["completed_s"].to_numpy(dtype=np.float64)
        tokens = q["output_tokens"].to_numpy()
        centres, rate = token_rate(first, done, tokens)
        top.plot(centres, rate, color=_color(i), label=run.label)
        if run.result.tokens_per_s is not None:
            top.axhline(
                run.result.tokens_per_s,
                color=_color(i),
                linestyle="--",
                linewidth=1,
                label=f"LoadGen: {run.result.tokens_per_s:,.1f} tok/s",
            )
        t, n = in_flight(q["issued_s"].to_numpy(dtype=np.float64), done)
        bottom.step(t, n, where="post", color=_color(i), label=run.label)
    if not plotted:
        _no_data(top, "no per-query records (queries.parquet)")
    top.set_title("Output tokens per second over the run")
    top.set_ylabel("output tokens/s")
    top.set_ylim(bottom=0)
    bottom.set_title("Queries in flight (issued by LoadGen, not yet completed)")
    bottom.set_ylabel("queries")
    bottom.set_xlabel("time since the run started (s)")
    bottom.set_ylim(bottom=0)
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        if plotted:
            ax.legend(loc="upper right", fontsize=8)
    return _save(fig, path)


def plot_output_lengths(runs: list[Run], path: Path) -> Path:
    fig = Figure(figsize=(9, 4.8), layout="constrained")
    ax = fig.subplots()
    lengths = [
        (i, r, r.queries["output_tokens"].to_numpy()) for i, r in enumerate(runs) if r.queries is not None
    ]
    lengths = [(i, r, x) for i, r, x in lengths if len(x)]
    if lengths:
        hi = max(int(x.max()) for _, _, x in lengths)
        edges = np.histogram_bin_edges(np.arange(hi + 2), bins=min(50, hi + 1))
        for i, run, x in lengths:
            ax.hist(
                x,
                bins=edges,
                color=_color(i),
                alpha=0.55 if len(lengths) > 1 else 0.85,
                label=f"{run.label} (mean {x.mean():,.1f}, n={len(x):,})",
            )
        ax.legend(loc="upper right", fontsize=8)
    else:
        _no_data(ax, "no per-query records (queries.parquet)")
    ax.set_title("Output length per query")
    ax.set_xlabel("output tokens")
    ax.set_ylabel("queries")
    ax.grid(alpha=0.3)
    return _save(fig, path)


PLOTS = (
    ("latency_cdf.png", "TTFT and TPOT distributions", plot_latency),
    ("throughput.png", "Output tokens/s and queries in flight over time", plot_timeline),
    ("output_lengths.png", "Output-length histogram", plot_output_lengths),
)


def write_plots(runs: list[Run], out: Path) -> list[tuple[str, str]]:
    """[(file name, caption)] of the PNGs written into `out`."""
    return [(plot(runs, out / name).name, caption) for name, caption, plot in PLOTS]

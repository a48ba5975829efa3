"""make_report: run directories -> PNGs + report.md in one folder."""

from __future__ import annotations

from pathlib import Path

from harness.report.markdown import render
from harness.report.runs import ReportError, load_runs

REPORT_FILE = "report.md"


def make_report(log_dirs: list[Path], out: Path, labels: list[str] | None = None) -> Path:
    """Write the plots and report.md of `log_dirs` (one run, or several compared) into `out`;
    returns the path of report.md."""
    from harness.report.plots import write_plots  # matplotlib only here: the package imports fast

    if not log_dirs:
        raise ReportError("no run directory given")
    runs = load_runs([Path(d) for d in log_dirs], labels)
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ReportError(f"--out {out}: {e.strerror or e}") from None
    plots = write_plots(runs, out)
    path = out / REPORT_FILE
    path.write_text(render(runs, plots))
    return path

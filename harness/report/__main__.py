"""python -m harness.report RUN_DIR [RUN_DIR ...] [--out DIR] [--label NAME ...]"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.report.build import make_report
from harness.report.runs import ReportError


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m harness.report",
        description="Plots (latency CDFs against the limits, tokens/s and queries in flight over time, "
        "output lengths) and report.md for one run, or several runs overlaid and compared (ratios to the "
        "first).",
    )
    p.add_argument(
        "run_dirs",
        nargs="+",
        type=Path,
        metavar="RUN_DIR",
        help="a run's log directory, OUTPUT_DIR/<scenario>/<performance|accuracy|TESTxx>",
    )
    p.add_argument(
        "--out",
        type=Path,
        help="where the PNGs and report.md go (default: RUN_DIR/report for one run, ./report for several)",
    )
    p.add_argument(
        "--label", action="append", default=[], help="a run's name in tables and legends (repeat, in order)"
    )
    args = p.parse_args(argv)
    out = args.out or (args.run_dirs[0] / "report" if len(args.run_dirs) == 1 else Path("report"))
    try:
        path = make_report(args.run_dirs, out, args.label)
    except ReportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

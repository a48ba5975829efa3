"""python -m harness.submission --runs OUTPUT_DIR ... --submitter ORG --system NAME --division closed|open
--out SUBMISSION_DIR [--checker PATH]"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.submission.build import DIVISIONS, build_submission
from harness.submission.checker import DEFAULT_VERSION, run_checker
from harness.submission.pieces import SubmissionError

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_CHECKER = 0, 1, 2, 4


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m harness.submission",
        description="Lay out an MLPerf inference submission for gpt-oss-120b from run_mlperf.py output "
        "directories. Refuses (exit 1, naming the piece) when a scenario's performance run is missing or "
        "INVALID, its accuracy run is missing or failed, or (closed) a TEST07/TEST09 run is missing or "
        "failed.",
    )
    p.add_argument(
        "--runs",
        nargs="+",
        type=Path,
        required=True,
        metavar="OUTPUT_DIR",
        help="run_mlperf.py --output-dir directories (OUTPUT_DIR/<scenario>/<mode>/)",
    )
    p.add_argument("--submitter", required=True, help="organization name")
    p.add_argument("--system", required=True, help="system description id (systems/<system>.json)")
    p.add_argument("--division", required=True, choices=DIVISIONS)
    p.add_argument("--out", type=Path, required=True, metavar="SUBMISSION_DIR")
    p.add_argument("--overwrite", action="store_true", help="replace a tree this command wrote at --out")
    p.add_argument(
        "--checker",
        type=Path,
        metavar="PATH",
        help="an mlcommons/inference checkout: run its submission_checker on the tree",
    )
    p.add_argument("--checker-version", default=DEFAULT_VERSION, help=f"(default: {DEFAULT_VERSION})")
    args = p.parse_args(argv)
    try:
        built = build_submission(
            args.runs,
            args.out,
            submitter=args.submitter,
            system=args.system,
            division=args.division,
            overwrite=args.overwrite,
        )
    except SubmissionError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_REFUSED
    print(f"submission tree: {built.root}")
    print(f"fill in {built.system_json}: {', '.join(built.to_fill) or 'nothing'}")
    for w in built.warnings:
        print(f"warning: the official checker will reject this: {w}")
    print(f"to do before submitting: {built.todo}")
    if args.checker is None:
        return EXIT_OK
    try:
        verdict = run_checker(args.checker, args.out, submitter=args.submitter, version=args.checker_version)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    for line in verdict.errors:
        print(f"checker: {line}")
    print(
        f"submission_checker {args.checker_version}: {verdict.summary or f'exit code {verdict.returncode}'}"
    )
    return EXIT_OK if verdict.ok else EXIT_CHECKER


if __name__ == "__main__":
    sys.exit(main())

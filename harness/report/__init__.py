"""Run results: LoadGen's logs read back, the console summary, and (python -m harness.report) the
plots, report.md and run comparison. Importing the package loads no plotting library."""

from harness.report.console import print_failures, print_summary
from harness.report.detail import DetailLog, Result, read_detail, summarize

__all__ = ["DetailLog", "Result", "print_failures", "print_summary", "read_detail", "summarize"]

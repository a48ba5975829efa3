"""python -m harness.submission: an MLPerf inference submission tree for gpt-oss-120b from the runs
in OUTPUT_DIRs, refused with a named reason when a piece is missing, INVALID or failed."""

from harness.submission.build import build_submission
from harness.submission.pieces import SubmissionError

__all__ = ["SubmissionError", "build_submission"]

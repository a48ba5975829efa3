"""An accuracy run end to end: log → tokens → final channel → graders → exact_match → JSON."""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from evaluation import graders
from evaluation.accuracy_log import AccuracyLogError, LogEntry, load_accuracy_log
from evaluation.harmony import VOCAB_SIZE, Output
from evaluation.reference import DatasetError, ReferenceRow, load_reference
from evaluation.scoring import PASS_THRESHOLD, DatasetScore, exact_match


@dataclass(slots=True)
class SampleResult:
    seq_id: int
    qsl_idx: int
    dataset: str
    output_tokens: int
    final_channel: bool
    correct: bool | None = None  # None: could not be graded
    extracted: str | None = None
    detail: str = ""


def evaluate_run(
    accuracy_log: Path,
    dataset: Path,
    output_json: Path,
    *,
    lcb_tests: Path | None = None,
    workers: int | None = None,
    lcb_timeout_s: float | None = None,
    isolation: str = "auto",
    quiet: bool = False,
) -> dict:
    """Score an accuracy log against its dataset, print the report and write `output_json`.

    Raises AccuracyLogError / DatasetError when the inputs do not fit together. A result that is
    not valid (rows missing from the log, ungradable samples, sandbox failures) never passes.
    """
    entries = load_accuracy_log(Path(accuracy_log))
    rows = load_reference(Path(dataset))
    check_join(entries, rows, accuracy_log, dataset)

    samples: list[SampleResult] = []
    lcb_jobs: dict[int, tuple[str, str]] = {}  # sample index -> (code, question_id)
    for entry in entries:
        row = rows[entry.qsl_idx]
        sample, code = grade_entry(entry, row)
        if code is not None:
            lcb_jobs[len(samples)] = (code, row.ground_truth)
        samples.append(sample)
    # The generated code must not read the expected outputs, nor the answers in the dataset.
    secrets = tuple(str(p) for p in (lcb_tests, dataset, accuracy_log) if p is not None)
    used = grade_livecodebench(
        samples, lcb_jobs, lcb_tests, workers, lcb_timeout_s, isolation, secrets, quiet
    )

    result = summarize(samples, rows, entries)
    # "fallback": generated code ran without namespaces and could read the host's files.
    result["sandbox_isolation"] = used
    result["inputs"] = {
        "accuracy_log": str(accuracy_log),
        "dataset": str(dataset),
        "lcb_tests": None if lcb_tests is None else str(lcb_tests),
    }
    result["samples"] = [asdict(s) for s in samples]
    output_json = Path(output_json)
    output_json.parent.mkdir(parents=True, exist_ok=True)
    output_json.write_text(json.dumps(result, indent=1))
    if not quiet:
        from evaluation.report import print_report

        print_report(result)
    return result


def check_join(entries: list[LogEntry], rows: list[ReferenceRow], log: Path, dataset: Path) -> None:
    beyond = sorted({e.qsl_idx for e in entries if e.qsl_idx >= len(rows)})
    if beyond:
        raise AccuracyLogError(
            f"{log}: qsl_idx {beyond[:5]} beyond the {len(rows)} rows of {dataset}; "
            "was the run made on another dataset?"
        )
    no_truth = sorted({e.qsl_idx for e in entries if rows[e.qsl_idx].ground_truth is None})
    if no_truth:
        raise DatasetError(f"{dataset}: rows {no_truth[:5]} ({len(no_truth)} in all) have no ground_truth")


def grade_entry(entry: LogEntry, row: ReferenceRow) -> tuple[SampleResult, str | None]:
    """Grade AIME/GPQA now; for LiveCodeBench return the extracted code to run later."""
    sample = SampleResult(entry.seq_id, entry.qsl_idx, row.dataset, len(entry.tokens), False)
    bad = next((t for t in entry.tokens if not 0 <= t < VOCAB_SIZE), None)
    if bad is not None:
        sample.correct, sample.detail = False, f"invalid token id {bad}"
        return sample, None
    out = Output(entry.tokens)
    sample.final_channel = out.final is not None
    fam = graders.family(row.dataset)
    if fam == "livecodebench":
        code = graders.extract_code(out)
        if code is None:
            sample.correct, sample.detail = False, "no code block"
        else:
            sample.extracted = code
        return sample, code
    graded = (
        graders.grade_aime(out, row.ground_truth)
        if fam == "aime"
        else graders.grade_gpqa(out, row.ground_truth)
    )
    sample.correct, sample.extracted, sample.detail = graded.correct, graded.extracted, graded.detail
    return sample, None


def grade_livecodebench(samples, jobs, lcb_tests, workers, timeout_s, isolation, hide, quiet) -> str | None:
    """Run the extracted programs; returns the sandbox isolation used (None: no program ran)."""
    if not jobs:
        return None
    if lcb_tests is None:
        for i in jobs:
            samples[i].detail = "not graded: no --lcb-tests file"
        return None
    from evaluation.lcb_tests import load_lcb_tests
    from evaluation.livecodebench import grade_many
    from evaluation.sandbox import Limits, Sandbox

    problems = load_lcb_tests(Path(lcb_tests), {qid for _, qid in jobs.values()})
    runnable = {}
    for i, (code, qid) in jobs.items():
        if qid in problems:
            runnable[i] = (code, problems[qid])
        else:
            samples[i].detail = f"not graded: question_id {qid} is not in {lcb_tests}"
    limits = Limits() if timeout_s is None else Limits(wall_s=timeout_s)
    sandbox = Sandbox(limits, isolation, hide=hide)
    with progress(len(runnable), quiet) as advance:
        verdicts = grade_many(runnable, sandbox, workers or len(os.sched_getaffinity(0)), advance)
    for i, verdict in verdicts.items():
        samples[i].correct = verdict.passed
        samples[i].detail = (
            verdict.status
            if verdict.passed
            else f"{verdict.status} on test {verdict.failed_case + 1}/{len(runnable[i][1].tests)}: "
            f"{verdict.detail}"
        )
    return sandbox.isolation


class progress:
    """A progress bar on stderr for the slow part (running generated code)."""

    def __init__(self, total: int, quiet: bool) -> None:
        self.total, self.quiet, self.bar = total, quiet, None

    def __enter__(self):
        if self.quiet:
            return lambda: None
        from rich.console import Console
        from rich.progress import Progress

        self.bar = Progress(console=Console(stderr=True), transient=True)
        self.bar.start()
        task = self.bar.add_task("LiveCodeBench", total=self.total)
        return lambda: self.bar.advance(task)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()


def summarize(samples: list[SampleResult], rows: list[ReferenceRow], entries: list[LogEntry]) -> dict:
    per: dict[str, list[int]] = {}
    for s in samples:
        counts = per.setdefault(s.dataset, [0, 0, 0])  # correct, total, ungraded
        counts[0] += s.correct is True
        counts[1] += 1
        counts[2] += s.correct is None
    scores = [DatasetScore(name, c, t) for name, (c, t, _) in sorted(per.items())]
    seen = Counter(e.qsl_idx for e in entries)
    missing = len(rows) - len(seen)
    duplicates = sum(n - 1 for n in seen.values())
    ungraded = sum(u for _, _, u in per.values())
    sandbox_errors = sum("sandbox_error" in s.detail for s in samples)
    invalid_tokens = sum(s.detail.startswith("invalid token id") for s in samples)
    problems = []
    if missing:
        problems.append(f"{missing} of {len(rows)} dataset rows are missing from the log")
    if duplicates:
        problems.append(f"{duplicates} duplicate log entries")
    if ungraded:
        problems.append(f"{ungraded} samples could not be graded")
    if sandbox_errors:
        problems.append(f"{sandbox_errors} samples hit a sandbox error")
    if invalid_tokens:
        problems.append(f"{invalid_tokens} samples hold token ids outside the vocabulary")
    score = exact_match(scores) if scores and not ungraded else None
    return {
        "exact_match": score,
        "threshold": PASS_THRESHOLD,
        "passed": score is not None and score >= PASS_THRESHOLD and not problems,
        "valid": not problems,
        "problems": problems,
        "per_dataset": {
            s.name: {
                "correct": s.correct,
                "total": s.total,
                "repeats": s.repeats,
                "accuracy": s.accuracy,
                "component_score": s.component,
                "max_component_score": s.max_component,
                "ungraded": per[s.name][2],
            }
            for s in scores
        },
        "counts": {
            "log_entries": len(entries),
            "dataset_rows": len(rows),
            "missing_rows": missing,
            "duplicate_entries": duplicates,
            "ungraded": ungraded,
            "sandbox_errors": sandbox_errors,
            "invalid_token_ids": invalid_tokens,
            "without_final_channel": sum(not s.final_channel for s in samples),
            "mean_output_tokens": sum(s.output_tokens for s in samples) / len(samples) if samples else 0.0,
        },
    }

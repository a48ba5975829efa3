"""The runs a submission is made of, found in OUTPUT_DIRs and checked: every scenario needs a VALID
performance run, a passing accuracy run and (closed division) passing TEST07 and TEST09 runs.
A missing or failed piece is refused with its name and path."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.report.runs import Run, load_run

BENCHMARK = "gpt-oss-120b"  # the only gpt-oss benchmark; Interactive is one of its scenarios
SCENARIO_DIRS = {"offline": "Offline", "server": "Server", "interactive": "Interactive"}
MODES = ("performance", "accuracy", "TEST07", "TEST09")
VERIFY_FILES = {"TEST07": "verify_accuracy.txt", "TEST09": "verify_output_len.txt"}
# What the official checker needs of a closed result (checker constants, v6.0/v6.1).
OFFICIAL_MIN_DURATION_MS = 600_000
OFFICIAL_PERFORMANCE_SAMPLES = 6396
OFFICIAL_ACCURACY_SAMPLES = 4395


class SubmissionError(ValueError):
    """Refused: the message names every missing or failed piece."""


@dataclass(slots=True)
class ScenarioRuns:
    scenario: str  # ours: offline | server | interactive
    runs: dict[str, Run] = field(default_factory=dict)  # mode -> run

    @property
    def name(self) -> str:  # the submission's directory name
        return SCENARIO_DIRS[self.scenario]


def collect(output_dirs: list[Path]) -> dict[str, ScenarioRuns]:
    """Every OUTPUT_DIR/<scenario>/<mode> run log directory, by scenario; the same piece in two
    OUTPUT_DIRs is an error (which one is the submission's?)."""
    found: dict[str, ScenarioRuns] = {}
    problems = []
    for out in output_dirs:
        out = Path(out)
        if not out.is_dir():
            problems.append(f"--runs {out}: not a directory")
            continue
        for scenario in SCENARIO_DIRS:
            for mode in MODES:
                log_dir = out / scenario / mode
                if not (log_dir / "mlperf_log_detail.txt").is_file():
                    continue
                entry = found.setdefault(scenario, ScenarioRuns(scenario))
                if mode in entry.runs:
                    problems.append(
                        f"{SCENARIO_DIRS[scenario]} {mode}: two runs, {entry.runs[mode].log_dir} and "
                        f"{log_dir}; pass only the OUTPUT_DIR whose run the submission should hold"
                    )
                    continue
                entry.runs[mode] = load_run(log_dir)
    if problems:
        raise SubmissionError("\n".join(problems))
    if not found:
        raise SubmissionError(
            f"no runs found in {', '.join(map(str, output_dirs))} (expected OUTPUT_DIR/<scenario>/<mode>/ "
            "holding LoadGen's logs, as run_mlperf.py --output-dir OUTPUT_DIR writes them)"
        )
    return found


def _run_problems(piece: str, run: Run) -> list[str]:
    where = f"{piece} ({run.log_dir})"
    rec = run.record
    if not rec:
        return [f"{where}: no run.json: not a run of this harness, or it did not start"]
    problems = []
    if rec.get("status") != "finished":
        problems.append(f"{where}: the run did not finish (status {rec.get('status')!r})")
    failed = rec.get("failures", {}).get("count", 0)
    if failed:
        reasons = "; ".join(f"{n} x {r}" for r, n in rec["failures"].get("reasons", {}).items())
        problems.append(f"{where}: {failed} queries failed ({reasons})")
    if run.result.loadgen_errors:
        problems.append(f"{where}: LoadGen logged errors: {'; '.join(run.result.loadgen_errors[:3])}")
    return problems


def check_performance(piece: str, run: Run) -> list[str]:
    problems = _run_problems(piece, run)
    if run.result.validity != "VALID":
        reason = run.result.invalid_reason or "see mlperf_log_summary.txt"
        problems.append(f"{piece} ({run.log_dir}): LoadGen says {run.result.validity}: {reason}")
    return problems


def check_accuracy(piece: str, run: Run) -> list[str]:
    problems = _run_problems(piece, run)
    evaluation = run.record.get("evaluation")
    where = f"{piece} ({run.log_dir})"
    if not evaluation:
        problems.append(f"{where}: accuracy was not scored (the dataset has no ground truths)")
    elif "error" in evaluation:
        problems.append(f"{where}: accuracy could not be scored: {evaluation['error']}")
    elif not evaluation.get("passed"):
        score = evaluation.get("exact_match")
        shown = "none" if score is None else f"{score:.3f}"
        extra = "; ".join(evaluation.get("problems", []))
        problems.append(
            f"{where}: accuracy FAIL: exact_match {shown} (needs >= {evaluation.get('threshold')})"
            + (f"; {extra}" if extra else "")
        )
    elif not (run.log_dir / "accuracy.json").is_file():
        problems.append(f"{where}: accuracy.json (the scored result) is missing")
    return problems


def verify_file(test: str, run: Run) -> Path:
    """Where evaluation.compliance.verify wrote the test's verdict."""
    return run.log_dir / test / VERIFY_FILES[test]


def check_compliance(piece: str, test: str, run: Run) -> list[str]:
    problems = _run_problems(piece, run)
    where = f"{piece} ({run.log_dir})"
    path = verify_file(test, run)
    outcome = run.record.get("compliance") or {}
    if not path.is_file():
        problems.append(f"{where}: {path.name} is missing: the test was not verified")
    elif "TEST PASS" not in path.read_text() or outcome.get("passed") is False:
        problems.append(f"{where}: {test} FAILED (see {path})")
    return problems


def check(found: dict[str, ScenarioRuns], division: str) -> list[str]:
    """Every problem that stops the submission (empty: it can be built)."""
    problems = []
    if division == "closed" and "offline" not in found:
        problems.append(f"closed division: {BENCHMARK} needs an Offline result; no offline/ runs were found")
    for scenario, entry in found.items():
        name = entry.name
        runs = entry.runs
        for mode in MODES:
            piece = f"{name} {mode}"
            run = runs.get(mode)
            if run is None:
                if mode.startswith("TEST") and division == "open":
                    continue  # the checker skips compliance in the open division
                flag = {"performance": "", "accuracy": " --accuracy"}.get(mode, f" --compliance {mode}")
                problems.append(
                    f"{piece}: missing (run run_mlperf.py --scenario {scenario}{flag} into one of the "
                    "OUTPUT_DIRs)"
                )
            elif mode == "performance":
                problems += check_performance(piece, run)
            elif mode == "accuracy":
                problems += check_accuracy(piece, run)
            else:
                problems += check_compliance(piece, mode, run)
        model = runs[next(iter(runs))].record.get("config", {}).get("model_name", BENCHMARK)
        if division == "closed" and model != BENCHMARK:
            problems.append(f"{name}: --model-name {model}: the closed division's benchmark is {BENCHMARK}")
    return problems


def official_gaps(found: dict[str, ScenarioRuns]) -> list[str]:
    """What the official checker will reject although the runs are VALID here (short smoke settings,
    small datasets): warnings, so that short runs can still be laid out and looked at."""
    notes = []
    for entry in found.values():
        perf = entry.runs.get("performance")
        if perf is not None:
            s = perf.record.get("loadgen_settings", {})
            if s.get("min_duration_ms", OFFICIAL_MIN_DURATION_MS) < OFFICIAL_MIN_DURATION_MS:
                notes.append(
                    f"{entry.name} performance: min_duration {s['min_duration_ms'] / 1000:g} s < 600 s"
                )
            if (
                s.get("performance_sample_count_override", OFFICIAL_PERFORMANCE_SAMPLES)
                < OFFICIAL_PERFORMANCE_SAMPLES
            ):
                notes.append(
                    f"{entry.name} performance: {s['performance_sample_count_override']} performance samples "
                    f"< {OFFICIAL_PERFORMANCE_SAMPLES} (the full perf_eval_ref dataset)"
                )
            queries = s.get("min_query_count", OFFICIAL_PERFORMANCE_SAMPLES)
            if entry.scenario == "offline" and queries < OFFICIAL_PERFORMANCE_SAMPLES:
                notes.append(
                    f"Offline performance: min_query_count {queries} < {OFFICIAL_PERFORMANCE_SAMPLES} samples"
                )
            pct = s.get("server_target_latency_percentile", 0.99)
            if entry.scenario != "offline" and pct != 0.99:
                notes.append(f"{entry.name} performance: latency judged at p{pct * 100:g}, not p99")
        acc = entry.runs.get("accuracy")
        if acc is not None:
            rows = acc.record.get("dataset", {}).get("rows")
            if rows is not None and rows != OFFICIAL_ACCURACY_SAMPLES:
                notes.append(
                    f"{entry.name} accuracy: {rows} samples, the official accuracy dataset has "
                    f"{OFFICIAL_ACCURACY_SAMPLES}"
                )
    return notes

"""Write the MLPerf inference submission layout (mlcommons/inference tools/submission,
submission_structure.md, v6.x) from checked runs:

<division>/<submitter>/systems/<system>.json
<division>/<submitter>/src/gpt-oss-120b/README.md            (the checker's v6 name for code/)
<division>/<submitter>/results/<system>/gpt-oss-120b/<Scenario>/
    performance/run_1/mlperf_log_{summary,detail}.txt
    accuracy/{mlperf_log_summary.txt, mlperf_log_detail.txt, mlperf_log_accuracy.json, accuracy.txt}
    TEST07/{verify_accuracy.txt, accuracy/{mlperf_log_accuracy.json, accuracy.txt}, performance/run_1/...}
    TEST09/{verify_output_len.txt, accuracy/..., performance/run_1/...}
    user.conf, [mlperf.conf], measurements.json, README.md
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from harness.report.runs import Run
from harness.submission.pieces import BENCHMARK, VERIFY_FILES, ScenarioRuns

LOG_FILES = ("mlperf_log_summary.txt", "mlperf_log_detail.txt")
ACCURACY_LOG = "mlperf_log_accuracy.json"
VIEWABLE = 4096  # tools/submission/truncate_accuracy_log.py: keep 4 KiB from each end
UNTRUNCATED_DIR = "untruncated_accuracy_logs"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def copy_truncated(src: Path, dst: Path, keep: Path) -> str:
    """Copy the accuracy log truncated as truncate_accuracy_log.py does (the checker refuses one over
    10 KiB); the full log goes to `keep`. Returns the full log's sha256 (accuracy.txt's hash=)."""
    digest = sha256(src)
    keep.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, keep)
    text = src.read_text()
    if len(text) > VIEWABLE:
        text = text[:VIEWABLE] + "\n\n...\n\n" + text[-VIEWABLE:]
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(text)
    return digest


def _copy_logs(src_dir: Path, dst_dir: Path) -> None:
    dst_dir.mkdir(parents=True, exist_ok=True)
    for name in LOG_FILES:
        shutil.copyfile(src_dir / name, dst_dir / name)


def accuracy_text(run: Run, digest: str) -> str:
    """accuracy.txt: our scored report, then the lines the checker parses ('exact_match': X,
    'tokens_per_sample': Y, hash=...), as the reference's eval_mlperf_accuracy.py prints them."""
    from io import StringIO

    from rich.console import Console

    from evaluation.report import print_report

    result = json.loads((run.log_dir / "accuracy.json").read_text())
    buffer = StringIO()
    print_report(result, Console(file=buffer, width=100, highlight=False, color_system=None))
    tokens = result.get("counts", {}).get("mean_output_tokens", 0.0)
    return (
        buffer.getvalue()
        + "\nPrinting for submission_checker:\n"
        + f"\n'exact_match': {result['exact_match']:.3f}\n"
        + f"'tokens_per_sample': {tokens:.1f}\n"
        + f"hash={digest}\n"
    )


def user_conf(runs: list[Run]) -> str:
    """The performance run's user.conf, plus the settings its flags overrode, as conf lines."""
    perf = runs[0]
    cfg = perf.record.get("config", {})
    lines = [f"# user.conf of {perf.log_dir} (command: {perf.record.get('command', '?')})"]
    if cfg.get("user_conf") and Path(cfg["user_conf"]).is_file():
        lines += Path(cfg["user_conf"]).read_text().rstrip().splitlines()
    model = cfg.get("model_name", BENCHMARK) + (
        "-interactive" if cfg.get("scenario") == "interactive" else ""
    )
    scenario = "Offline" if cfg.get("scenario") == "offline" else "Server"
    flags = {
        "target_qps": cfg.get("target_qps"),
        "min_duration": None if cfg.get("min_duration_s") is None else round(cfg["min_duration_s"] * 1000),
        "min_query_count": cfg.get("min_query_count"),
        "target_latency_percentile": (
            None if cfg.get("latency_percentile") is None else round(cfg["latency_percentile"] * 100, 6)
        ),
    }
    given = {k: v for k, v in flags.items() if v is not None}
    if given:
        lines.append("# set by run_mlperf.py flags")
        lines += [f"{model}.{scenario}.{k} = {v:g}" for k, v in given.items()]
    return "\n".join(lines) + "\n"


def measurements(run: Run) -> dict[str, Any]:
    model_path = run.record.get("config", {}).get("model_path")
    return {
        "input_data_types": "int32",  # token ids
        "retraining": "No",
        "starting_weights_filename": Path(model_path).name if model_path else "openai/gpt-oss-120b",
        "weight_data_types": "bf16 (attention, router, embeddings), MXFP4 (MoE experts), as released",
        "weight_transformations": "none",
    }


def readme(scenario: ScenarioRuns, commit: str | None) -> str:
    lines = [
        f"# {BENCHMARK} {scenario.name}",
        "",
        f"Harness: gptoss-mlperf, commit {commit or 'unknown'} (see ../../../../src/{BENCHMARK}/README.md).",
        "",
        "Each piece was run with:",
        "",
    ]
    for mode, run in scenario.runs.items():
        lines += [f"- {mode}:", "", "  ```bash", f"  {run.record.get('command', '?')}", "  ```", ""]
    return "\n".join(lines)


def src_readme(commit: str | None, remote: str | None, packages: dict[str, str]) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in sorted(packages.items()))
    return "\n".join(
        [
            f"# {BENCHMARK}: gptoss-mlperf",
            "",
            "The code of this submission is the gptoss-mlperf harness (MLPerf LoadGen, one SUT for Offline,",
            "Server and Interactive, the gptoss / vllm / sglang / openai backends).",
            "",
            f"- repository: {remote or 'gptoss-mlperf (no git remote recorded)'}",
            f"- commit: {commit or 'unknown (not run from a git checkout)'}",
            f"- packages: {versions}",
            "",
            "Install with `./setup.sh`, then run the commands in each "
            "results/<system>/gpt-oss-120b/<Scenario>/README.md.",
            "",
        ]
    )


def write_scenario(scenario: ScenarioRuns, dst: Path, keep: Path, commit: str | None) -> None:
    runs = scenario.runs
    _copy_logs(runs["performance"].log_dir, dst / "performance" / "run_1")
    acc = runs["accuracy"]
    _copy_logs(acc.log_dir, dst / "accuracy")
    digest = copy_truncated(
        acc.log_dir / ACCURACY_LOG, dst / "accuracy" / ACCURACY_LOG, keep / "accuracy" / ACCURACY_LOG
    )
    (dst / "accuracy" / "accuracy.txt").write_text(accuracy_text(acc, digest))
    for test, verify_name in VERIFY_FILES.items():
        run = runs.get(test)
        if run is None:
            continue  # open division: compliance is optional
        made = run.log_dir / test  # evaluation.compliance.verify's layout
        out = dst / test
        out.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(made / verify_name, out / verify_name)
        _copy_logs(made / "performance" / "run_1", out / "performance" / "run_1")
        digest = copy_truncated(
            made / "accuracy" / ACCURACY_LOG,
            out / "accuracy" / ACCURACY_LOG,
            keep / test / "accuracy" / ACCURACY_LOG,
        )
        (out / "accuracy" / "accuracy.txt").write_text(f"hash={digest}\n")
    perf = runs["performance"]
    (dst / "user.conf").write_text(user_conf([perf]))
    mlperf_conf = perf.record.get("config", {}).get("mlperf_conf")
    if mlperf_conf and Path(mlperf_conf).is_file():  # else LoadGen's built-in one (optional here)
        shutil.copyfile(mlperf_conf, dst / "mlperf.conf")
    (dst / "measurements.json").write_text(json.dumps(measurements(perf), indent=4) + "\n")
    (dst / "README.md").write_text(readme(scenario, commit))


def write_tree(
    found: dict[str, ScenarioRuns],
    out: Path,
    *,
    division: str,
    submitter: str,
    system: str,
    system_json: dict[str, Any],
    commit: str | None,
    remote: str | None,
    packages: dict[str, str],
) -> Path:
    """Write the tree under `out`; returns <out>/<division>/<submitter>."""
    root = out / division / submitter
    (root / "systems").mkdir(parents=True, exist_ok=True)
    (root / "systems" / f"{system}.json").write_text(json.dumps(system_json, indent=4) + "\n")
    src = root / "src" / BENCHMARK
    src.mkdir(parents=True, exist_ok=True)
    (src / "README.md").write_text(src_readme(commit, remote, packages))
    for scenario in found.values():
        rel = Path(division, submitter, "results", system, BENCHMARK, scenario.name)
        write_scenario(scenario, out / rel, out / UNTRUNCATED_DIR / rel, commit)
    return root

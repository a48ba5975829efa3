"""One run's results read back from its log directory: LoadGen's numbers and verdict, run.json and
queries.parquet."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson
import pandas as pd

from harness.queries import FILE_NAME as QUERIES_FILE
from harness.report.detail import Result, read_detail, summarize
from harness.report.verdict import Verdict, read_verdict

DETAIL_FILE = "mlperf_log_detail.txt"


class ReportError(ValueError):
    """A run directory that cannot be reported on; the message names it and says why."""


@dataclass(frozen=True, slots=True)
class Run:
    log_dir: Path
    label: str
    scenario: str  # ours: offline | server | interactive (LoadGen's for runs without run.json)
    mode: str  # performance | accuracy | TEST07 | TEST09
    result: Result  # LoadGen's numbers (the detail log)
    verdict: Verdict | None  # LoadGen's summary
    record: dict[str, Any]  # run.json ({} when absent)
    queries: pd.DataFrame | None  # queries.parquet (None when absent)

    @property
    def failed(self) -> int | None:
        if self.queries is not None:
            return int((self.queries["error"] != "").sum())
        count = self.record.get("failures", {}).get("count")
        return None if count is None else int(count)

    @property
    def limits_ns(self) -> tuple[int | None, int | None]:
        return self.result.ttft_limit_ns, self.result.tpot_limit_ns


def find_log_dirs(path: Path) -> list[Path]:
    """The run log directories at or under `path` (OUTPUT_DIR/<scenario>/<mode>)."""
    return sorted(p.parent for p in Path(path).rglob(DETAIL_FILE) if "run_1" not in p.parts)


def load_run(log_dir: Path, label: str | None = None) -> Run:
    log_dir = Path(log_dir)
    if not (log_dir / DETAIL_FILE).is_file():
        below = find_log_dirs(log_dir) if log_dir.is_dir() else []
        hint = (
            f"; the run directories under it are: {', '.join(map(str, below))}"
            if below
            else ("" if log_dir.exists() else " (it does not exist)")
        )
        raise ReportError(f"{log_dir} is not a run's log directory: it has no {DETAIL_FILE}{hint}")
    record: dict[str, Any] = {}
    if (log_dir / "run.json").is_file():
        record = orjson.loads((log_dir / "run.json").read_bytes())
    detail = read_detail(log_dir)
    v = detail.values
    loadgen_scenario = str(v.get("effective_scenario", "Offline"))
    mode_text = str(v.get("effective_test_mode", ""))
    accuracy = "Accuracy" in mode_text and "Performance" not in mode_text
    result = summarize(
        detail,
        scenario=loadgen_scenario,
        accuracy=accuracy,
        ttft_limit_ns=v.get("requested_server_ttft_latency"),
        tpot_limit_ns=v.get("requested_server_tpot_latency"),
    )
    config = record.get("config", {})
    scenario = config.get("scenario") or loadgen_scenario.lower()
    mode = config.get("compliance") or ("accuracy" if accuracy else "performance")
    queries = pd.read_parquet(log_dir / QUERIES_FILE) if (log_dir / QUERIES_FILE).is_file() else None
    return Run(
        log_dir=log_dir,
        label=label or _default_label(log_dir),
        scenario=scenario,
        mode=mode,
        result=result,
        verdict=read_verdict(log_dir),
        record=record,
        queries=queries,
    )


def _default_label(log_dir: Path) -> str:
    parts = log_dir.resolve().parts
    return "/".join(parts[-3:])


def load_runs(log_dirs: list[Path], labels: list[str] | None = None) -> list[Run]:
    labels = list(labels or [])
    if len(labels) > len(log_dirs):
        raise ReportError(f"{len(labels)} labels for {len(log_dirs)} runs")
    runs = [load_run(d, labels[i] if i < len(labels) else None) for i, d in enumerate(log_dirs)]
    seen: dict[str, int] = {}
    out = []
    for i, run in enumerate(runs):
        n = seen[run.label] = seen.get(run.label, 0) + 1
        if n > 1:  # the same label twice would make the plots' legends ambiguous
            run = replace(run, label=f"{run.label} ({i + 1})")
        out.append(run)
    return out

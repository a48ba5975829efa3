"""LoadGen's detail log (mlperf_log_detail.txt) and the headline numbers of a run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

_PREFIX = ":::MLLOG "


@dataclass(frozen=True, slots=True)
class DetailLog:
    values: dict[str, Any]  # key -> last value logged
    errors: tuple[str, ...]  # messages LoadGen logged as errors, in order
    warnings: tuple[str, ...]


def read_detail(log_dir: Path) -> DetailLog:
    path = Path(log_dir) / "mlperf_log_detail.txt"
    values: dict[str, Any] = {}
    errors: list[str] = []
    warnings: list[str] = []
    with open(path, "rb") as f:
        for line in f:
            if not line.startswith(_PREFIX.encode()):
                continue
            entry = orjson.loads(line[len(_PREFIX) :])
            values[entry["key"]] = entry["value"]
            meta = entry.get("metadata", {})
            if meta.get("is_error"):
                errors.append(str(entry["value"]))
            elif meta.get("is_warning"):
                warnings.append(str(entry["value"]))
    return DetailLog(values, tuple(errors), tuple(warnings))


@dataclass(frozen=True, slots=True)
class Result:
    """The headline numbers of one LoadGen run (None where LoadGen did not report them)."""

    scenario: str  # "Offline" | "Server"
    accuracy: bool
    validity: str | None  # "VALID" | "INVALID"; None in accuracy mode
    invalid_reason: str | None
    samples_per_s: float | None
    tokens_per_s: float | None
    ttft_p50_ns: int | None
    ttft_p99_ns: int | None
    tpot_p50_ns: int | None
    tpot_p99_ns: int | None
    ttft_limit_ns: int | None
    tpot_limit_ns: int | None
    loadgen_errors: tuple[str, ...]
    # The percentile LoadGen judged the limits at (0.99 but in the embedded default's smoke run),
    # and the TTFT/TPOT there.
    target_percentile: float | None = None
    ttft_target_ns: int | None = None
    tpot_target_ns: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


def summarize(
    log: DetailLog, *, scenario: str, accuracy: bool, ttft_limit_ns: int, tpot_limit_ns: int
) -> Result:
    v = log.values
    server = scenario == "Server"
    validity = None if accuracy else v.get("result_validity")
    reason = None
    if validity == "INVALID":
        parts = [str(v.get("result_invalid_reason", "")).strip()]
        if v.get("early_stopping_met") is False:
            for key in ("early_stopping_ttft_result", "early_stopping_tpot_result", "early_stopping_result"):
                text = str(v.get(key, "")).strip()
                if text and "Run successful" not in text:
                    parts.append(f"early stopping: {text}")
        reason = " ".join(p for p in parts if p) or "see mlperf_log_detail.txt"
    pct = v.get("effective_target_latency_percentile") if server else None
    at = f"{pct * 100:.2f}" if isinstance(pct, int | float) else None
    return Result(
        scenario=scenario,
        accuracy=accuracy,
        validity=validity,
        invalid_reason=reason,
        samples_per_s=v.get("result_completed_samples_per_sec" if server else "result_samples_per_second"),
        tokens_per_s=v.get("result_completed_tokens_per_second" if server else "result_tokens_per_second"),
        ttft_p50_ns=v.get("result_first_token_50.00_percentile_latency_ns"),
        ttft_p99_ns=v.get("result_first_token_99.00_percentile_latency_ns"),
        tpot_p50_ns=v.get("result_time_per_output_token_50.00_percentile_ns"),
        tpot_p99_ns=v.get("result_time_per_output_token_99.00_percentile_ns"),
        ttft_limit_ns=ttft_limit_ns if server else None,
        tpot_limit_ns=tpot_limit_ns if server else None,
        loadgen_errors=log.errors,
        target_percentile=pct,
        ttft_target_ns=v.get(f"result_first_token_{at}_percentile_latency_ns") if at else None,
        tpot_target_ns=v.get(f"result_time_per_output_token_{at}_percentile_ns") if at else None,
    )

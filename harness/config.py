"""Frozen run configuration and the MLPerf constants for gpt-oss."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.base import SamplingParams  # the sampling every backend takes

VOCAB_SIZE = 201088

MAX_NEW_TOKENS_PERFORMANCE = 10240
MAX_NEW_TOKENS_ACCURACY = 32768

# The LoadGen model names whose rules (mlperf.conf) apply; Interactive is the Server scenario
# run under the "-interactive" name.
LOADGEN_MODEL = "gpt-oss-120b"
COMPLIANCE_TESTS = ("TEST07", "TEST09")

SCENARIOS = ("offline", "server", "interactive")


@dataclass(frozen=True, slots=True)
class RunConfig:
    """Everything one run needs, built once from flags (harness/cli.py) and passed whole.

    Backends read what backends.base.RunSpec lists: scenario, model_path, server_urls,
    max_concurrency, timeout_s, backend_options (an instance of the backend's Options) and log_dir.
    """

    backend: str
    scenario: str
    input_file: Path | None
    output_dir: Path
    sampling: SamplingParams
    accuracy: bool = False
    model_path: Path | None = None
    model_name: str = "gpt-oss-120b"
    server_urls: tuple[str, ...] = ()
    max_concurrency: int | None = None
    warmup: int = 0  # untimed queries before LoadGen starts (harness/warmup.py)
    timeout_s: float | None = None
    backend_options: Any = None
    # LoadGen settings: mlperf.conf (None: the one built into the LoadGen wheel), then user.conf,
    # then these flags, each overriding the one before.
    mlperf_conf: Path | None = None
    user_conf: Path | None = None
    target_qps: float | None = None
    min_duration_s: float | None = None
    min_query_count: int | None = None
    latency_percentile: float | None = None  # Server: LoadGen's target percentile (the smoke run's p90)
    max_samples: int | None = None  # use only the first N dataset rows
    compliance: str | None = None  # "TEST07" | "TEST09"
    interrupt_grace_s: float = 10.0  # after Ctrl-C, how long LoadGen may take to finish its logs
    report: bool = False  # write the report (plots + report.md) into <log_dir>/report at the end
    qps_sweep: tuple[float, ...] = ()  # Server/Interactive: a run per target QPS (harness/sweep.py)
    command: tuple[str, ...] = ()  # the argv that built this config, recorded in run.json
    notes: tuple[str, ...] = ()  # what the CLI decided for the user (printed, recorded in run.json)

    def __post_init__(self) -> None:
        if self.scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario '{self.scenario}'; choose one of {', '.join(SCENARIOS)}")
        if self.compliance is not None and self.compliance not in COMPLIANCE_TESTS:
            raise ValueError(
                f"unknown compliance test '{self.compliance}'; choose one of {', '.join(COMPLIANCE_TESTS)}"
            )
        if self.compliance is not None and self.accuracy:
            raise ValueError("--compliance runs in performance mode; drop --accuracy")
        for name in ("target_qps", "min_duration_s", "timeout_s", "interrupt_grace_s"):
            value = getattr(self, name)
            if value is not None and not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        for name in ("min_query_count", "max_samples", "max_concurrency"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")
        if self.latency_percentile is not None and not 0 < self.latency_percentile < 1:
            raise ValueError(f"latency_percentile must be in (0, 1), got {self.latency_percentile}")
        if self.target_qps == 0:
            raise ValueError("target_qps must be > 0")
        if self.qps_sweep:
            self._check_sweep()

    def _check_sweep(self) -> None:
        if self.scenario == "offline":
            raise ValueError("--qps-sweep is for the server and interactive scenarios")
        if self.accuracy or self.compliance:
            raise ValueError("--qps-sweep runs in performance mode; drop --accuracy / --compliance")
        if self.target_qps is not None:
            raise ValueError("give either --target-qps or --qps-sweep, not both")
        if not all(q > 0 and math.isfinite(q) for q in self.qps_sweep):
            raise ValueError(f"--qps-sweep values must be finite numbers > 0, got {list(self.qps_sweep)}")
        if list(self.qps_sweep) != sorted(set(self.qps_sweep)):
            raise ValueError(f"--qps-sweep values must be distinct and ascending, got {list(self.qps_sweep)}")

    @property
    def loadgen_scenario(self) -> str:
        return "Offline" if self.scenario == "offline" else "Server"

    def loadgen_model(self, name: str) -> str:
        """The conf-file model key: Interactive is Server under '<name>-interactive'."""
        return f"{name}-interactive" if self.scenario == "interactive" else name

    @property
    def log_dir(self) -> Path:
        """Where LoadGen writes this run's logs: OUTPUT_DIR/<scenario>/<performance|accuracy|TESTxx>."""
        mode = self.compliance or ("accuracy" if self.accuracy else "performance")
        return self.output_dir / self.scenario / mode

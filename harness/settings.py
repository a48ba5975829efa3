"""LoadGen TestSettings/LogSettings: mlperf.conf, then user.conf, then flags."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import mlperf_loadgen as lg

from harness.config import LOADGEN_MODEL, RunConfig

# conf_type values of TestSettings.FromConfig in LoadGen 6.x: 0 reads the mlperf.conf compiled
# into the wheel (path ignored), 2 reads `path` alone. (1 reads both, but counts calls in a static
# and logs an error from the second call on, which a process running several tests would hit.)
_BUILTIN, _FILE = 0, 2

# Keys LoadGen reads only from the built-in mlperf.conf (the conf_type == 0 branch). A custom
# --mlperf-conf must still set them, so they are applied here. multiplier: LoadGen's scale.
_MLPERF_CONF_ONLY: dict[str, tuple[str, float]] = {
    "qsl_rng_seed": ("qsl_rng_seed", 1),
    "sample_index_rng_seed": ("sample_index_rng_seed", 1),
    "schedule_rng_seed": ("schedule_rng_seed", 1),
    "accuracy_log_probability": ("accuracy_log_probability", 0.01),
    "test05_qsl_rng_seed": ("test05_qsl_rng_seed", 1),
    "test05_sample_index_rng_seed": ("test05_sample_index_rng_seed", 1),
    "test05_schedule_rng_seed": ("test05_schedule_rng_seed", 1),
}


_U64_MAX = 2**64 - 1  # LoadGen's counters and durations


class SettingsError(ValueError):
    pass


def parse_conf(path: Path) -> dict[str, str]:
    """Parse a LoadGen conf file exactly as LoadGen does, but fail with the line number.

    Lines are whitespace-separated `model.scenario.key = value`; a standalone '#' starts a
    comment; a value must be an integer (any C base) or a float.
    """
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise SettingsError(f"cannot read {path}: {e}") from None
    kv: dict[str, str] = {}
    for line_nr, line in enumerate(text.splitlines(), 1):
        words = line.split()
        if not words or words[0] == "#":
            continue
        if len(words) < 3 or words[1] != "=":
            raise SettingsError(
                f"{path}:{line_nr}: expected 'model.scenario.key = value', got {line.strip()!r}"
            )
        value = words[2]
        if not _is_number(value):
            raise SettingsError(
                f"{path}:{line_nr}: value {value!r} of {words[0]} is not an integer or a float"
            )
        if not _is_finite(value):
            # LoadGen's strtod takes inf, nan and 1e400; an infinite target_qps crashes it.
            raise SettingsError(f"{path}:{line_nr}: value {value!r} of {words[0]} is not a finite number")
        if value.startswith("-"):
            # No LoadGen key takes a negative value; its strtoull turns min_duration = -1 into
            # 584 million years.
            raise SettingsError(f"{path}:{line_nr}: value {value!r} of {words[0]} is negative")
        kv[words[0]] = value
    return kv


def _is_number(s: str) -> bool:
    try:
        int(s, 0)
        return True
    except ValueError:  # noqa: S110 - not an integer literal: maybe a float
        pass
    try:
        float(s)
        return True
    except ValueError:  # the answer itself: neither an integer nor a float literal
        return False


def _is_finite(s: str) -> bool:
    try:
        int(s, 0)
        return True
    except ValueError:
        return math.isfinite(float(s))


def _lookup(kv: dict[str, str], model: str, scenario: str, key: str) -> str | None:
    # LoadGen's order: exact, *.scenario, model.*, *.*
    for k in (f"{model}.{scenario}.{key}", f"*.{scenario}.{key}", f"{model}.*.{key}", f"*.*.{key}"):
        if k in kv:
            return kv[k]
    return None


def _from_config(ts: lg.TestSettings, path: str, model: str, scenario: str, conf_type: int) -> None:
    rc = ts.FromConfig(path, model, scenario, conf_type)
    if rc != 0:
        raise SettingsError(f"LoadGen could not apply {path or 'its built-in mlperf.conf'} (error {rc})")


def build_test_settings(cfg: RunConfig, n_samples: int) -> lg.TestSettings:
    """The TestSettings for `cfg` over a dataset of `n_samples` rows."""
    for flag, path in (("--mlperf-conf", cfg.mlperf_conf), ("--user-conf", cfg.user_conf)):
        if path is not None and not Path(path).is_file():
            raise SettingsError(f"{flag} {path} does not exist")
    scenario = cfg.loadgen_scenario
    rules_model = cfg.loadgen_model(LOADGEN_MODEL)
    ts = lg.TestSettings()
    if cfg.mlperf_conf is None:
        _from_config(ts, "", rules_model, scenario, _BUILTIN)
    else:
        kv = parse_conf(cfg.mlperf_conf)
        _from_config(ts, str(cfg.mlperf_conf), rules_model, scenario, _FILE)
        for key, (attr, scale) in _MLPERF_CONF_ONLY.items():
            value = _lookup(kv, rules_model, scenario, key)
            if value is not None:
                setattr(ts, attr, float(value) * scale if scale != 1 else int(value, 0))
    if cfg.user_conf is not None:
        parse_conf(cfg.user_conf)  # LoadGen only logs syntax errors; fail here with the line
        _from_config(ts, str(cfg.user_conf), cfg.loadgen_model(cfg.model_name), scenario, _FILE)

    ts.scenario = lg.TestScenario.Offline if scenario == "Offline" else lg.TestScenario.Server
    ts.mode = lg.TestMode.AccuracyOnly if cfg.accuracy else lg.TestMode.PerformanceOnly
    if cfg.target_qps is not None:
        if scenario == "Offline":
            ts.offline_expected_qps = cfg.target_qps
        else:
            ts.server_target_qps = cfg.target_qps
    if cfg.min_duration_s is not None:
        if not math.isfinite(cfg.min_duration_s) or cfg.min_duration_s * 1000 > _U64_MAX:
            raise SettingsError(f"--min-duration {cfg.min_duration_s:g} is not a usable number of seconds")
        ts.min_duration_ms = math.ceil(cfg.min_duration_s * 1000)
    if cfg.min_query_count is not None:
        if cfg.min_query_count > _U64_MAX:
            raise SettingsError(f"--min-query-count {cfg.min_query_count} is more than LoadGen can count")
        ts.min_query_count = cfg.min_query_count
    if cfg.latency_percentile is not None:
        ts.server_target_latency_percentile = cfg.latency_percentile
    _check_rates(ts, scenario)
    # A dataset smaller than the official one: say so in the logs instead of letting LoadGen
    # report 6396 performance samples while it loads fewer.
    if ts.performance_sample_count_override == 0 or ts.performance_sample_count_override > n_samples:
        ts.performance_sample_count_override = n_samples
    ts.accuracy_sample_count_override = min(ts.accuracy_sample_count_override, n_samples)
    return ts


def _check_rates(ts: lg.TestSettings, scenario: str) -> None:
    """What the confs and flags produced, where LoadGen would crash or never end instead of refusing."""
    qps, name = (
        (ts.offline_expected_qps, "Offline") if scenario == "Offline" else (ts.server_target_qps, "Server")
    )
    if not (math.isfinite(qps) and qps > 0):
        raise SettingsError(
            f"the {name} target_qps is {qps:g}: it must be a positive number (--target-qps, or target_qps in "
            "a conf)"
        )
    percentile = ts.server_target_latency_percentile
    if scenario == "Server" and not 0 < percentile < 1:
        raise SettingsError(
            f"target_latency_percentile is {percentile * 100:g}: it must lie between 0 and 100 (exclusive)"
        )


def build_log_settings(log_dir: Path) -> lg.LogSettings:
    ls = lg.LogSettings()
    ls.log_output.outdir = str(log_dir)
    ls.log_output.copy_summary_to_stdout = False  # we print our own summary table
    ls.enable_trace = False
    return ls


def describe(ts: lg.TestSettings) -> dict[str, Any]:
    """All TestSettings fields, for run.json."""
    out: dict[str, Any] = {}
    for name in dir(ts):
        if name.startswith("_") or name == "FromConfig":
            continue
        value = getattr(ts, name)
        out[name] = value.name if hasattr(value, "name") else value
    return out

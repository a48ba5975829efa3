"""Command-line flags -> RunConfig. A superset of the MLCommons gpt-oss-120b reference's flags."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

import backends
from harness.config import COMPLIANCE_TESTS, SCENARIOS, RunConfig
from harness.generation import DEFAULT_GENERATION_CONFIG, GenerationConfigError, load_sampling

ENV_BACKEND = "MLPERF_BACKEND"

EPILOG = f"""\
Settings apply in this order, each overriding the one before: the mlperf.conf built into the
LoadGen wheel (or --mlperf-conf), --user-conf, then --target-qps/--min-duration/--min-query-count.
Interactive is the Server scenario under LoadGen's '<model>-interactive' rules (TTFT 2 s, TPOT 15 ms).
The backend also comes from ${ENV_BACKEND}; --backend wins.

With no --input-file the run uses a small bundled synthetic dataset and short LoadGen settings
(a smoke test, not a submission); with no --model-path the gptoss backend uses a tiny
random-weight checkpoint made once under $MLPERF_DATA_DIR (default ~/.cache/gptoss-mlperf).

Exit codes: 0 success; 1 some queries failed (see the failure report); 2 bad flags, conf,
dataset or setup; 3 LoadGen says INVALID; 4 compliance verification failed; 130 interrupted
(Ctrl-C; 143 for SIGTERM).
"""


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _options_modules() -> list:
    """Each backend's flag module. Until a backend module exists in this checkout, skip it."""
    mods = []
    for name in dict.fromkeys(spec.options for spec in backends.SPECS.values()):
        try:
            mods.append(importlib.import_module(name))
        except ModuleNotFoundError as e:
            if e.name != name:
                raise  # the module exists but imports something missing: a real error
    return mods


class _Parser(argparse.ArgumentParser):
    """argparse, but a mistake is one line `error: ...` (not the 40-line usage and a prefix)."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (run_mlperf.py --help lists the flags)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="run_mlperf.py",
        description="Run MLPerf Inference (LoadGen) for gpt-oss on one of several backends.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--backend",
        default=None,
        help=f"{', '.join(backends.NAMES)} (default: ${ENV_BACKEND} or {backends.DEFAULT})",
    )
    p.add_argument(
        "--scenario", choices=SCENARIOS, default="offline", help="LoadGen scenario (default: offline)"
    )
    p.add_argument(
        "--input-file",
        type=Path,
        help="dataset, .parquet or .pkl in the MLCommons schema (default: bundled synthetic sample)",
    )
    p.add_argument("--max-samples", type=_positive_int, help="use only the first N rows of the dataset")
    p.add_argument(
        "--mlperf-conf", type=Path, help="mlperf.conf (default: the one built into the LoadGen wheel)"
    )
    p.add_argument("--user-conf", type=Path, help="user.conf applied over mlperf.conf")
    p.add_argument(
        "--accuracy", action="store_true", help="accuracy mode: every sample once, logged for scoring"
    )
    p.add_argument(
        "--output-dir",
        type=Path,
        default=Path("output"),
        help="logs go to OUTPUT_DIR/<scenario>/<performance|accuracy> (default: output)",
    )
    p.add_argument(
        "--server-url",
        action="append",
        default=[],
        help="HTTP backends: server URL (repeat for several servers)",
    )
    p.add_argument(
        "--generation-config",
        type=Path,
        help=f"sampling settings JSON (default: {DEFAULT_GENERATION_CONFIG.name} in harness/)",
    )
    p.add_argument(
        "--max-new-tokens",
        type=_positive_int,
        help="override max new tokens (default: 10240 performance, 32768 accuracy)",
    )
    p.add_argument(
        "--num-workers",
        type=int,
        help="accepted for compatibility with the MLCommons reference and ignored: the SUT runs every query on one asyncio loop",
    )
    p.add_argument(
        "--max-concurrency",
        type=_positive_int,
        help="most requests in flight to the backend (default: the backend's own)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        help="per-query limit in seconds: a longer query is completed with the tokens it has and counted as failed (default: none)",
    )
    p.add_argument(
        "--model-path",
        type=Path,
        help="checkpoint directory (gptoss, vllm) (default for gptoss: tiny random checkpoint)",
    )
    p.add_argument(
        "--model-name",
        default="gpt-oss-120b",
        help="model name for user.conf lookups, e.g. gpt-oss-20b (default: gpt-oss-120b)",
    )
    p.add_argument(
        "--target-qps", type=float, help="Server target QPS / Offline expected QPS (overrides the confs)"
    )
    p.add_argument("--min-duration", type=float, help="LoadGen min_duration in seconds (overrides the confs)")
    p.add_argument(
        "--min-query-count", type=_positive_int, help="LoadGen min_query_count (overrides the confs)"
    )
    p.add_argument(
        "--compliance",
        choices=COMPLIANCE_TESTS,
        help="run a compliance test with its official audit.config, then verify it",
    )
    p.add_argument(
        "--interrupt-grace",
        type=float,
        default=10.0,
        help="after Ctrl-C, seconds LoadGen may take to finish its logs before we exit without them (default: 10)",
    )
    # Remember which flags the backends' option modules add, to refuse one the chosen backend ignores.
    before = set(p._option_string_actions)
    for mod in _options_modules():
        mod.add_arguments(p)
    p.set_defaults(_backend_flags={o: a for o, a in p._option_string_actions.items() if o not in before})
    return p


class _ReadRecorder:
    """A view of the parsed flags that records which ones a backend's options() reads."""

    def __init__(self, ns: argparse.Namespace) -> None:
        self._ns, self.read = ns, set()

    def __getattr__(self, name: str):
        self.read.add(name)
        return getattr(self._ns, name)


# In-process backends load the model themselves; --server-url means nothing to them.
IN_PROCESS = ("gptoss", "vllm")


def _backend_options(options, backend: str, ns: argparse.Namespace, parser: argparse.ArgumentParser):
    """The chosen backend's options; a flag set for another backend is an error, not silently dropped."""
    view = _ReadRecorder(ns)
    result = options.options(view)
    foreign = sorted(
        {
            "/".join(action.option_strings)
            for action in ns._backend_flags.values()
            if action.dest not in view.read and getattr(ns, action.dest) != action.default
        }
    )
    if backend in IN_PROCESS and ns.server_url:
        foreign.insert(0, "--server-url")
    if foreign:
        one = len(foreign) == 1
        parser.error(
            f"{', '.join(foreign)} {'has' if one else 'have'} no effect with --backend {backend}; "
            f"remove {'it' if one else 'them'} or choose the backend {'it belongs' if one else 'they belong'} to"
        )
    return result


def _bundled_sample() -> Path:
    import data

    return Path(data.__file__).with_name("sample.parquet")


def _rows(path: Path) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows


def _embedded_default(ns: argparse.Namespace) -> tuple[Path, dict[str, float | int], list[str]]:
    """No --input-file: the bundled sample, plus short LoadGen settings for flags left unset
    (unless a user.conf says what the user wants)."""
    from harness.smoke import smoke_notes, smoke_settings

    path = _bundled_sample()
    rows = _rows(path)
    notes = [f"no --input-file: using the bundled synthetic dataset {path} ({rows} rows)"]
    if ns.user_conf is not None:
        return path, {}, notes
    short = {k: v for k, v in smoke_settings(ns.scenario, rows).items() if getattr(ns, k, None) is None}
    if short:
        notes += smoke_notes(ns.scenario, short)
    return path, short, notes


def config_from_args(ns: argparse.Namespace, parser: argparse.ArgumentParser, argv: list[str]) -> RunConfig:
    backend = ns.backend or os.environ.get(ENV_BACKEND) or backends.DEFAULT
    if backend not in backends.NAMES:
        source = "--backend" if ns.backend else ENV_BACKEND
        parser.error(f"{source}={backend!r} is not a backend; choose one of {', '.join(backends.NAMES)}")
    module = backends.SPECS[backend].options
    try:
        options = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:
            raise
        parser.error(f"backend '{backend}' is not part of this checkout ({module} is missing)")
    input_file, short, notes = (ns.input_file, {}, []) if ns.input_file else _embedded_default(ns)
    if ns.num_workers is not None:
        notes.append("--num-workers is ignored: every query runs on the SUT's one asyncio loop")

    def flag(name: str):
        value = getattr(ns, name)
        return short.get(name) if value is None else value

    try:
        return RunConfig(
            backend=backend,
            scenario=ns.scenario,
            input_file=input_file,
            output_dir=ns.output_dir,
            sampling=load_sampling(
                ns.generation_config, accuracy=ns.accuracy, max_new_tokens=ns.max_new_tokens
            ),
            accuracy=ns.accuracy,
            model_path=ns.model_path,
            model_name=ns.model_name,
            server_urls=tuple(ns.server_url),
            max_concurrency=ns.max_concurrency,
            timeout_s=ns.timeout,
            backend_options=_backend_options(options, backend, ns, parser),
            mlperf_conf=ns.mlperf_conf,
            user_conf=ns.user_conf,
            target_qps=flag("target_qps"),
            min_duration_s=flag("min_duration"),
            min_query_count=flag("min_query_count"),
            latency_percentile=short.get("latency_percentile"),
            max_samples=ns.max_samples,
            compliance=ns.compliance,
            interrupt_grace_s=ns.interrupt_grace,
            command=tuple(argv),
            notes=tuple(notes),
        )
    except GenerationConfigError:
        raise
    except ValueError as e:  # RunConfig's and SamplingParams' own checks (e.g. --compliance with --accuracy)
        parser.error(str(e))


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.markup import escape

    from backends.base import BackendError
    from harness.dataset import DatasetError
    from harness.runner import EXIT_USAGE, RunError, run
    from harness.settings import SettingsError

    argv = sys.argv if argv is None else argv
    parser = build_parser()
    ns = parser.parse_args(argv[1:])
    console = Console(highlight=False)
    try:
        cfg = config_from_args(ns, parser, argv)
        return run(cfg, console)
    except (DatasetError, SettingsError, GenerationConfigError, RunError, backends.BackendNotInstalled) as e:
        console.print(f"[bold red]error:[/] {escape(str(e))}", soft_wrap=True)
        return EXIT_USAGE
    except BackendError as e:  # the backend could not start (server unreachable, bad checkpoint ...)
        console.print(f"[bold red]error:[/] {escape(str(e))}", soft_wrap=True)
        return EXIT_USAGE
    except KeyboardInterrupt:  # outside LoadGen's test (model loading, evaluation): nothing to complete
        console.print("[bold red]interrupted[/]")
        return 130

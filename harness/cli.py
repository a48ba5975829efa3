"""Command-line flags -> RunConfig. A superset of the MLCommons gpt-oss-120b reference's flags.

The backend is chosen first (--backend, else $MLPERF_BACKEND); then the parser gets the core flags
plus that backend's own: the fields of its Options dataclass, so a flag means what its backend says.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

import backends
from harness.config import COMPLIANCE_TESTS, SCENARIOS, RunConfig
from harness.generation import DEFAULT_GENERATION_CONFIG, GenerationConfigError, load_sampling
from harness.notes import latency_notes
from harness.options import (
    Parser,
    add_options,
    integer,
    non_negative,
    non_negative_int,
    options_from,
    positive_int,
    qps_list,
)
from harness.smoke import embedded_default

ENV_BACKEND = "MLPERF_BACKEND"

EPILOG = f"""\
Settings apply in this order, each overriding the one before: the mlperf.conf built into the
LoadGen wheel (or --mlperf-conf), --user-conf, then --target-qps/--min-duration/--min-query-count.
Interactive is the Server scenario under LoadGen's '<model>-interactive' rules (TTFT 2 s, TPOT 15 ms).
The backend also comes from ${ENV_BACKEND}; --backend wins. Each backend's group lists its own
flags and defaults; a flag of another backend is an error.

With no --input-file the run uses a small bundled synthetic dataset and short LoadGen settings
(a smoke test, not a submission); with no --model-path the gptoss backend uses a tiny
random-weight checkpoint made once under $MLPERF_DATA_DIR (default ~/.cache/gptoss-mlperf).

OUTPUT_DIR/<scenario>/<mode>/ is the run's own: files a previous run left there (LoadGen logs,
run.json, accuracy.json, queries.parquet, report/, compliance results) are deleted first, and the
run says which.

Exit codes: 0 success; 1 some queries failed, or accuracy FAIL (see the report); 2 bad flags,
conf, dataset or setup; 3 LoadGen says INVALID; 4 compliance verification failed; 130
interrupted (Ctrl-C; 143 for SIGTERM).
"""


# ----------------------------------------------------------------------------- the parser


class _FullHelp(argparse.Action):
    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> NoReturn:
        parser._print_message(full_help(), sys.stdout)
        parser.exit()


def _backend_group(name: str) -> tuple[str, str]:
    cls = backends.backend_class(name)
    where = "runs the model itself" if cls.in_process else "talks to the servers at --server-url"
    return f"--backend {name}", f"{name} {where}; its flags are an error with any other backend"


def build_parser(backend: str | None = None) -> argparse.ArgumentParser:
    """The core flags, plus the flags of `backend` when given."""
    p = Parser(
        prog="run_mlperf.py",
        description="Run MLPerf Inference (LoadGen) for gpt-oss on one of several backends.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,
        allow_abbrev=False,  # a prefix of one backend's flag must not silently mean another's
    )
    p.add_argument(
        "-h", "--help", action=_FullHelp, help="show the core flags and every backend's, then exit"
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
    p.add_argument("--max-samples", type=positive_int, help="use only the first N rows of the dataset")
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
        help="HTTP backends: server URL, http://HOST:PORT (repeat for several servers)",
    )
    p.add_argument(
        "--generation-config",
        type=Path,
        help=f"sampling settings JSON (default: {DEFAULT_GENERATION_CONFIG.name} in harness/)",
    )
    p.add_argument(
        "--max-new-tokens",
        type=positive_int,
        help="override max new tokens (default: 10240 performance, 32768 accuracy)",
    )
    p.add_argument(
        "--num-workers",
        type=integer,
        help="accepted for compatibility with the MLCommons reference and ignored: the SUT runs every query "
        "on one asyncio loop",
    )
    p.add_argument(
        "--max-concurrency",
        type=positive_int,
        help="most requests in flight to the backend (default: the backend's own)",
    )
    p.add_argument(
        "--warmup",
        type=non_negative_int,
        default=0,
        metavar="N",
        help="before LoadGen starts, send N untimed queries (random ids at the dataset's prompt lengths, "
        "in doubling waves) so one-off compiles and captures stay out of the timed run (default: 0)",
    )
    p.add_argument(
        "--timeout",
        type=non_negative,
        help="per-query limit in seconds: a longer query is completed with the tokens it has and counted as "
        "failed (default: none)",
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
        "--target-qps",
        type=non_negative,
        help="Server target QPS / Offline expected QPS (overrides the confs)",
    )
    p.add_argument(
        "--qps-sweep",
        type=qps_list,
        default=(),
        metavar="Q1,Q2,...",
        help="server/interactive: one run per target QPS (ascending) on one started backend, stopping at "
        "the first INVALID one; prints the highest VALID QPS (runs in OUTPUT_DIR/qps_<Q>)",
    )
    p.add_argument(
        "--min-duration", type=non_negative, help="LoadGen min_duration in seconds (overrides the confs)"
    )
    p.add_argument(
        "--min-query-count", type=positive_int, help="LoadGen min_query_count (overrides the confs)"
    )
    p.add_argument(
        "--compliance",
        choices=COMPLIANCE_TESTS,
        help="run a compliance test with its official audit.config, then verify it",
    )
    p.add_argument(
        "--report",
        action="store_true",
        help="at the end, write plots and report.md into OUTPUT_DIR/<scenario>/<mode>/report "
        "(as python -m harness.report does)",
    )
    p.add_argument(
        "--interrupt-grace",
        type=non_negative,
        default=10.0,
        help="after Ctrl-C, seconds LoadGen may take to finish its logs before we exit without them "
        "(default: 10)",
    )
    if backend is not None:
        add_options(p, backends.backend_class(backend).Options, *_backend_group(backend))
    return p


def full_help() -> str:
    """The core flags, then each backend's group (flags of the same name differ by backend)."""
    core = build_parser()
    fmt = core._get_formatter()
    fmt.add_usage(core.usage, core._actions, core._mutually_exclusive_groups)
    fmt.add_text(core.description)
    groups = list(core._action_groups)
    groups += [build_parser(name)._action_groups[-1] for name in backends.NAMES]
    for group in groups:
        fmt.start_section(group.title)
        fmt.add_text(group.description)
        fmt.add_arguments(group._group_actions)
        fmt.end_section()
    fmt.add_text(core.epilog)
    return fmt.format_help()


def _chosen_backend(argv: list[str]) -> tuple[str | None, str]:
    """(the backend, or None when the name is not one, and where the name came from)."""
    pre = Parser(add_help=False, allow_abbrev=False)
    pre.add_argument("--backend")
    ns, _ = pre.parse_known_args(argv[1:])
    name = ns.backend or os.environ.get(ENV_BACKEND) or backends.DEFAULT
    source = "--backend" if ns.backend else ENV_BACKEND
    return (name if name in backends.NAMES else None), f"{source}={name!r}"


def _owners(option: str, chosen: str) -> list[str]:
    """The other backends that have the flag `option`."""
    out = []
    for name in backends.NAMES:
        if name != chosen:
            parser = build_parser(name)
            if option in {o for a in parser._action_groups[-1]._group_actions for o in a.option_strings}:
                out.append(name)
    return out


def _refuse_foreign(rest: list[str], backend: str, parser: argparse.ArgumentParser, server_url: bool) -> None:
    """A flag of another backend is an error that says so, never silently ignored."""
    flags = [a.split("=", 1)[0] for a in rest if a.startswith("--")]
    owners = {f: _owners(f, backend) for f in flags}
    unknown = [f for f, o in owners.items() if not o]
    if unknown or (rest and not flags):
        parser.error(f"unrecognized arguments: {' '.join(rest)} (run_mlperf.py --help lists every flag)")
    foreign = (["--server-url"] if server_url else []) + list(dict.fromkeys(flags))
    if not foreign:
        return
    one = len(foreign) == 1
    belongs = sorted({b for f in foreign for b in owners.get(f, [])})
    parser.error(
        f"{', '.join(foreign)} {'has' if one else 'have'} no effect with --backend {backend}; "
        f"remove {'it' if one else 'them'} or choose the backend {'it belongs' if one else 'they belong'} to"
        + (f" ({', '.join(belongs)})" if belongs else "")
    )


# ----------------------------------------------------------------------------- flags -> RunConfig


def check_url(url: str) -> None:
    """--server-url must be http(s)://HOST[:PORT][/path]."""
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018 -- raises ValueError on a bad port
    except ValueError as e:
        raise ValueError(f"--server-url {url!r}: {e}; give http://HOST:PORT") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--server-url {url!r} is not an http(s) URL; give http://HOST:PORT")


def config_from_args(
    ns: argparse.Namespace, parser: argparse.ArgumentParser, argv: list[str], backend: str
) -> RunConfig:
    cls = backends.backend_class(backend)
    input_file, short, notes = (ns.input_file, {}, []) if ns.input_file else embedded_default(ns)
    if ns.num_workers is not None:
        notes.append("--num-workers is ignored: every query runs on the SUT's one asyncio loop")
    try:
        options = options_from(ns, cls.Options)
    except ValueError as e:  # the options' own checks
        parser.error(str(e))
    notes += latency_notes(
        backend, ns.scenario, options, accuracy=ns.accuracy, warmup=ns.warmup, sweep=bool(ns.qps_sweep)
    )

    def flag(name: str):
        value = getattr(ns, name)
        return short.get(name) if value is None else value

    try:
        for url in ns.server_url:
            check_url(url)
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
            warmup=ns.warmup,
            timeout_s=ns.timeout,
            backend_options=options,
            mlperf_conf=ns.mlperf_conf,
            user_conf=ns.user_conf,
            target_qps=flag("target_qps"),
            min_duration_s=flag("min_duration"),
            min_query_count=flag("min_query_count"),
            latency_percentile=short.get("latency_percentile"),
            max_samples=ns.max_samples,
            compliance=ns.compliance,
            interrupt_grace_s=ns.interrupt_grace,
            report=ns.report,
            qps_sweep=ns.qps_sweep,
            command=tuple(argv),
            notes=tuple(notes),
        )
    except GenerationConfigError:
        raise
    except ValueError as e:  # the options', RunConfig's and SamplingParams' own checks
        parser.error(str(e))


def parse_config(argv: list[str]) -> RunConfig:
    """argv (with the program name first) -> RunConfig; a bad flag exits 2 with one `error:` line."""
    backend, source = _chosen_backend(argv)
    if backend is None and not {"-h", "--help"} & set(argv[1:]):
        Parser(prog="run_mlperf.py").error(
            f"{source} is not a backend; choose one of {', '.join(backends.NAMES)}"
        )
    parser = build_parser(backend)
    ns, rest = parser.parse_known_args(argv[1:])
    cls = backends.backend_class(backend)
    server_url = bool(ns.server_url) and cls.in_process
    if rest or server_url:
        _refuse_foreign(rest, backend, parser, server_url)
    return config_from_args(ns, parser, argv, backend)


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.markup import escape

    from backends.base import BackendError
    from harness.dataset import DatasetError
    from harness.runner import EXIT_USAGE, RunError, run
    from harness.settings import SettingsError
    from harness.sweep import run_sweep

    argv = sys.argv if argv is None else argv
    console = Console(highlight=False)
    try:
        cfg = parse_config(argv)
        return run_sweep(cfg, console) if cfg.qps_sweep else run(cfg, console)
    except (
        DatasetError,
        SettingsError,
        GenerationConfigError,
        RunError,
        backends.BackendNotInstalled,
        BackendError,  # the backend could not start (server unreachable, bad checkpoint ...)
    ) as e:
        console.print(f"[bold red]error:[/] {escape(str(e))}", soft_wrap=True)
        return EXIT_USAGE
    except KeyboardInterrupt:  # outside LoadGen's test (model loading, evaluation): nothing to complete
        console.print("[bold red]interrupted[/]")
        return 130

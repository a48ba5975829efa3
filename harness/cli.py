"""Command-line flags -> RunConfig. A superset of the MLCommons gpt-oss-120b reference's flags.

The backend is chosen first (--backend, else $MLPERF_BACKEND); then the parser gets the core flags
plus that backend's own: the fields of its Options dataclass, so a flag means what its backend says.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

import backends
from harness.config import COMPLIANCE_TESTS, SCENARIOS, RunConfig
from harness.generation import DEFAULT_GENERATION_CONFIG, GenerationConfigError, load_sampling

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


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One line naming the flag and what to do; no usage block (--help has it)."""
        self.exit(2, f"error: {message}\n")


# ----------------------------------------------------------------------------- values


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _non_negative(text: str) -> float:
    value = _finite(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _qps_list(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got '{text}'") from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _named(parse: Any, name: str) -> Any:
    """argparse prints the type's __name__ in 'invalid <name> value'; keep it readable."""
    parse.__name__ = name
    return parse


# ----------------------------------------------------------------------------- options dataclasses -> flags
# A field is a flag when its metadata has "help". Optional metadata: "flag" (the option string,
# default --field-name), "choices", "type" (parses the text), "metavar", "repeat" (a repeatable
# flag collected into a tuple), "default_help" (how --help states the default).

_PARSE: dict[type, Any] = {int: _int, float: _finite, str: str, Path: Path}
_UNSET: Any = type("Unset", (), {"__repr__": lambda self: "unset"})()  # a parsed value may be None


def option_fields(cls: type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if "help" in f.metadata]


def flag_of(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def _dest(f: dataclasses.Field) -> str:
    return "opt_" + f.name  # never the dest of a core flag


def _base(hint: Any) -> type:
    """int for `int | None`, etc."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0] if len(args) == 1 else object
    return typing.get_origin(hint) or hint


def _help(f: dataclasses.Field) -> str:
    shown = f.metadata.get("default_help")
    if shown is None:
        default = f.default
        if default is None or default == ():
            return f.metadata["help"]
        shown = {True: "on", False: "off"}.get(default, default) if isinstance(default, bool) else default
    return f"{f.metadata['help']} (default: {shown})".replace("%", "%%")


def _checked(parse: Any, name: str) -> Any:
    """A field's parser that also refuses non-finite numbers (inf, nan, 1e400) whatever it returns."""

    def run(text: str) -> Any:
        value = parse(text)
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        return value

    return _named(run, name)


def add_options(
    parser: argparse.ArgumentParser, cls: type, title: str, description: str | None = None
) -> None:
    """The flag fields of the dataclass `cls` as a group of flags (an unset one keeps the field default)."""
    hints = typing.get_type_hints(cls)
    group = parser.add_argument_group(title, description)
    for f in option_fields(cls):
        base = _base(hints[f.name])
        kw: dict[str, Any] = {"dest": _dest(f), "default": _UNSET, "help": _help(f)}
        if base is bool and "type" not in f.metadata:
            kw["action"] = argparse.BooleanOptionalAction
        else:
            parse = f.metadata.get("type") or _PARSE.get(base)
            if parse is None:
                raise TypeError(f"{cls.__name__}.{f.name}: give a 'type' in its metadata to parse {base}")
            kw["type"] = _checked(parse, getattr(base, "__name__", "value"))
            if "choices" in f.metadata:
                kw["choices"] = f.metadata["choices"]
            else:
                kw["metavar"] = (
                    f.metadata.get("metavar") or flag_of(f).removeprefix("--").replace("-", "_").upper()
                )
            if f.metadata.get("repeat"):
                kw["action"], kw["default"] = "append", None
        group.add_argument(flag_of(f), **kw)


class OptionsError(ValueError):
    """Options that parse but do not fit together; the message names the flags."""


def options_from(ns: argparse.Namespace, cls: type, **given: Any) -> Any:
    """The dataclass from the parsed flags: a flag left unset keeps the field's default."""
    values = dict(given)
    for f in option_fields(cls):
        value = getattr(ns, _dest(f), _UNSET)
        if f.metadata.get("repeat"):
            if value:  # None when never given
                values[f.name] = tuple(value)
        elif value is not _UNSET:
            values[f.name] = value
    try:
        return cls(**values)
    except ValueError as e:  # the dataclass's own check, in field names: say the flags instead
        message = str(e)
        for f in option_fields(cls):  # whole words: the field device must not rename devices
            message = re.sub(rf"\b{f.name}\b", flag_of(f), message)
        raise OptionsError(message) from None


def parse_options(cls: type, argv: list[str], prog: str = "options") -> Any:
    """`cls` from a list of its flags alone (bench scripts, tests)."""
    parser = _Parser(prog=prog, allow_abbrev=False)
    add_options(parser, cls, cls.__name__)
    try:
        return options_from(parser.parse_args(argv), cls)
    except OptionsError as e:
        parser.error(str(e))


# ----------------------------------------------------------------------------- the parser


class _FullHelp(argparse.Action):
    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> NoReturn:
        parser._print_message(full_help(), sys.stdout)
        parser.exit()


def _backend_group(name: str) -> tuple[str, str]:
    cls = backends.backend_class(name)
    where = "runs the model in this process" if cls.in_process else "talks to the servers at --server-url"
    return f"--backend {name}", f"{name} {where}; its flags are an error with any other backend"


def build_parser(backend: str | None = None) -> argparse.ArgumentParser:
    """The core flags, plus the flags of `backend` when given."""
    p = _Parser(
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
        help="HTTP backends: server URL, http://HOST:PORT (repeat for several servers)",
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
        type=_int,
        help="accepted for compatibility with the MLCommons reference and ignored: the SUT runs every query "
        "on one asyncio loop",
    )
    p.add_argument(
        "--max-concurrency",
        type=_positive_int,
        help="most requests in flight to the backend (default: the backend's own)",
    )
    p.add_argument(
        "--timeout",
        type=_non_negative,
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
        type=_non_negative,
        help="Server target QPS / Offline expected QPS (overrides the confs)",
    )
    p.add_argument(
        "--qps-sweep",
        type=_qps_list,
        default=(),
        metavar="Q1,Q2,...",
        help="server/interactive: one run per target QPS (ascending) on one started backend, stopping at "
        "the first INVALID one; prints the highest VALID QPS (runs in OUTPUT_DIR/qps_<Q>)",
    )
    p.add_argument(
        "--min-duration", type=_non_negative, help="LoadGen min_duration in seconds (overrides the confs)"
    )
    p.add_argument(
        "--min-query-count", type=_positive_int, help="LoadGen min_query_count (overrides the confs)"
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
        type=_non_negative,
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
    pre = _Parser(add_help=False, allow_abbrev=False)
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
    if ns.qps_sweep:
        short.pop("target_qps", None)  # the sweep gives each run its own
    if short:
        notes += smoke_notes(ns.scenario, short)
    return path, short, notes


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
    input_file, short, notes = (ns.input_file, {}, []) if ns.input_file else _embedded_default(ns)
    if ns.num_workers is not None:
        notes.append("--num-workers is ignored: every query runs on the SUT's one asyncio loop")

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
            timeout_s=ns.timeout,
            backend_options=options_from(ns, cls.Options),
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
        _Parser(prog="run_mlperf.py").error(
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

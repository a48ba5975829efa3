"""Every mistake a user can make ends the same way: exit 2, one line `error: ...` naming the problem,
no traceback, and no wait. One table row per mistake (flags, conf files, datasets, servers, output
directories, checkpoints), each run as `python run_mlperf.py ...` in a process of its own, so that a
crash (LoadGen segfaults on an infinite rate) fails the row instead of the test session.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
FAULT_SERVER = ROOT / "tests" / "backends" / "fault_server.py"
WALL_S = 60.0  # each row, start to exit: a mistake never waits (a slow CPU still fits easily)

pytestmark = pytest.mark.timeout(600)


@dataclass(frozen=True, slots=True)
class Row:
    """argv after run_mlperf.py; `{tmp}`, `{fault}` and `{refused}` are filled in, and `make` writes
    the files a row needs into the row's directory first."""

    id: str
    argv: tuple[str, ...]
    check: str  # a regular expression the `error:` line must match: it names the problem
    code: int = 2
    make: Callable[[Path], None] | None = None


# ----------------------------------------------------------------------------- files the rows use


def _frame(**columns) -> pd.DataFrame:
    base = {
        "tok_input": [[200006, 17360, 200008, 13225, 2375]] * 2,
        "tok_input_len": [5, 5],
        "dataset": ["gpqa_diamond", "aime25"],
        "ground_truth": ["A", "7"],
        "max_output_len": [4, 4],
    }
    base.update(columns)
    return pd.DataFrame({k: v for k, v in base.items() if v is not None})


def parquet(name: str, **columns) -> Callable[[Path], None]:
    return lambda d: _frame(**columns).to_parquet(d / name)


def text(name: str, content: str | bytes) -> Callable[[Path], None]:
    def make(d: Path) -> None:
        (d / name).write_bytes(content if isinstance(content, bytes) else content.encode())

    return make


def checkpoint(corrupt: str) -> Callable[[Path], None]:
    """A copy of the tiny checkpoint (made once for all rows, beside theirs) with one thing broken."""

    def make(d: Path) -> None:
        import shutil

        ckpt = d / "ckpt"
        shutil.copytree(d.parents[1] / "tiny-good", ckpt)
        if corrupt == "config":
            (ckpt / "config.json").write_text('{"model_type": "gpt_oss", "hidden_size": ')
        elif corrupt == "weights":
            for f in ckpt.glob("*.safetensors"):
                f.write_bytes(f.read_bytes()[: f.stat().st_size // 3])
        elif corrupt == "no_weights":
            for f in ckpt.glob("*.safetensors"):
                f.unlink()

    return make


SAMPLE = str(ROOT / "data" / "sample.parquet")
HTTP = ("--backend", "sglang", "--input-file", SAMPLE)  # fails before any model is loaded
REFUSED = ("--server-url", "{refused}")

ROWS = [
    # ------------------------------------------------------------------ flags
    Row("flag-target-qps-text", ("--target-qps", "fast"), r"--target-qps.*'fast'"),
    Row("flag-kernels-triton-on-cpu", ("--kernels", "triton", "--device", "cpu"), r"TRITON_INTERPRET=1"),
    Row("flag-target-qps-negative", ("--target-qps", "-5"), r"target.qps"),
    Row("flag-target-qps-zero", ("--target-qps", "0"), r"target.qps"),
    Row("flag-target-qps-nan", ("--target-qps", "nan"), r"target.qps"),
    Row(
        "flag-target-qps-inf", ("--scenario", "server", "--target-qps", "inf", *HTTP, *REFUSED), r"target.qps"
    ),
    Row("flag-target-qps-1e400", ("--target-qps", "1e400", *HTTP, *REFUSED), r"target.qps"),
    Row("flag-min-duration-negative", ("--min-duration", "-1"), r"min.duration"),
    Row("flag-min-duration-inf", ("--min-duration", "inf", *HTTP, *REFUSED), r"min.duration"),
    Row("flag-min-query-count-zero", ("--min-query-count", "0"), r"--min-query-count"),
    Row("flag-min-query-count-float", ("--min-query-count", "1.5"), r"--min-query-count.*'1.5'"),
    Row("flag-min-query-count-huge", ("--min-query-count", str(10**30), *HTTP, *REFUSED), r"min.query.count"),
    Row("flag-max-new-tokens-zero", ("--max-new-tokens", "0"), r"--max-new-tokens"),
    Row("flag-timeout-negative", ("--timeout", "-1"), r"timeout"),
    Row("flag-timeout-nan", ("--timeout", "nan"), r"timeout"),
    Row("flag-timeout-inf", ("--timeout", "inf", *HTTP, *REFUSED), r"timeout"),
    Row("flag-max-concurrency-zero", ("--max-concurrency", "0"), r"--max-concurrency"),
    Row(
        "flag-max-concurrency-over-fd-limit",
        (*HTTP, *REFUSED, "--max-concurrency", "100000000"),
        r"--max-concurrency 100000000 needs about 100000064 open files|cannot raise the open-files limit",
    ),
    Row("flag-max-samples-zero", ("--max-samples", "0"), r"--max-samples"),
    Row("flag-interrupt-grace-negative", ("--interrupt-grace", "-1"), r"interrupt.grace"),
    Row("flag-interrupt-grace-inf", ("--interrupt-grace", "inf", *HTTP, *REFUSED), r"interrupt.grace"),
    Row("flag-scenario", ("--scenario", "turbo"), r"--scenario.*'turbo'"),
    Row("flag-backend", ("--backend", "tensorrt"), r"'tensorrt' is not a backend"),
    Row("flag-unknown", ("--tempreature", "0"), r"unrecognized arguments: --tempreature"),
    Row(
        "flag-compliance-with-accuracy", ("--compliance", "TEST07", "--accuracy"), r"--compliance.*--accuracy"
    ),
    Row("flag-foreign-backend-flag", ("--backend", "gptoss", "--retries", "2"), r"--retries has no effect"),
    Row("flag-retries-negative", (*HTTP, "--retries", "-1"), r"--retries"),
    Row("flag-ready-timeout-nan", (*HTTP, "--ready-timeout", "nan"), r"--ready-timeout"),
    Row("flag-ready-timeout-inf", (*HTTP, *REFUSED, "--ready-timeout", "inf"), r"--ready-timeout"),
    # ------------------------------------------------------------------ conf files
    Row("conf-user-missing", ("--user-conf", "{tmp}/nope.conf"), r"--user-conf .*nope.conf does not exist"),
    Row(
        "conf-mlperf-missing",
        ("--mlperf-conf", "{tmp}/nope.conf"),
        r"--mlperf-conf .*nope.conf does not exist",
    ),
    Row(
        "conf-syntax",
        ("--user-conf", "{tmp}/u.conf"),
        r"u.conf:2: expected 'model.scenario.key = value'",
        make=text("u.conf", "# ok\ngpt-oss-120b.Server.target_qps: 3\n"),
    ),
    Row(
        "conf-not-a-number",
        ("--user-conf", "{tmp}/u.conf"),
        r"u.conf:1: value 'fast' .* not an integer or a float",
        make=text("u.conf", "gpt-oss-120b.Offline.target_qps = fast\n"),
    ),
    Row(
        "conf-inf",
        ("--scenario", "server", "--user-conf", "{tmp}/u.conf", *HTTP, *REFUSED),
        r"u.conf:1: value 'inf' of gpt-oss-120b.Server.target_qps is not a finite number",
        make=text("u.conf", "gpt-oss-120b.Server.target_qps = inf\n"),
    ),
    Row(
        "conf-nan",
        ("--user-conf", "{tmp}/u.conf"),
        r"u.conf:1: value 'nan' .* is not a finite number",
        make=text("u.conf", "*.*.min_duration = nan\n"),
    ),
    Row(
        "conf-1e400",
        ("--user-conf", "{tmp}/u.conf"),
        r"u.conf:1: value '1e400' .* is not a finite number",
        make=text("u.conf", "gpt-oss-120b.Offline.target_qps = 1e400\n"),
    ),
    Row(
        "conf-negative-duration",
        ("--user-conf", "{tmp}/u.conf"),
        r"u.conf:1: value '-1' of .*min_duration is negative",
        make=text("u.conf", "gpt-oss-120b.Offline.min_duration = -1\n"),
    ),
    Row(
        "conf-zero-qps",
        ("--scenario", "server", "--user-conf", "{tmp}/u.conf", *HTTP, *REFUSED),
        r"Server target_qps is 0: it must be a positive number",
        make=text("u.conf", "gpt-oss-120b.Server.target_qps = 0\n"),
    ),
    Row(
        "conf-percentile-over-100",
        ("--scenario", "server", "--user-conf", "{tmp}/u.conf", *HTTP, *REFUSED),
        r"target_latency_percentile is 150",
        make=text("u.conf", "gpt-oss-120b.Server.target_latency_percentile = 150\n"),
    ),
    Row("conf-is-a-directory", ("--user-conf", "{tmp}"), r"--user-conf .* does not exist|cannot read"),
    Row(
        "generation-config-missing",
        ("--generation-config", "{tmp}/g.json"),
        r"generation config .*g.json does not exist",
    ),
    Row(
        "generation-config-nan",
        ("--generation-config", "{tmp}/g.json"),
        r"'temperature' must be a number, got nan",
        make=text("g.json", '{"temperature": NaN}'),
    ),
    Row(
        "generation-config-not-json",
        ("--generation-config", "{tmp}/g.json"),
        r"cannot read generation config",
        make=text("g.json", "{temperature: 1}"),
    ),
    # ------------------------------------------------------------------ datasets
    Row("dataset-missing", ("--input-file", "{tmp}/none.parquet"), r"none.parquet: no such file"),
    Row(
        "dataset-not-parquet",
        ("--input-file", "{tmp}/d.parquet"),
        r"cannot read dataset .*d.parquet",
        make=text("d.parquet", b"PAR1 but not really"),
    ),
    Row(
        "dataset-csv",
        ("--input-file", "{tmp}/d.csv"),
        r"expected a .parquet or .pkl file",
        make=text("d.csv", "tok_input\n1\n"),
    ),
    Row(
        "dataset-no-tok-input",
        ("--input-file", "{tmp}/d.parquet"),
        r"tok_input",
        make=parquet("d.parquet", tok_input=None),
    ),
    Row(
        "dataset-text-prompts",
        ("--input-file", "{tmp}/d.parquet"),
        r"row 0, column 'tok_input'",
        make=parquet("d.parquet", tok_input=["hello", "world"]),
    ),
    Row(
        "dataset-empty",
        ("--input-file", "{tmp}/d.parquet"),
        r"has no rows",
        make=lambda d: _frame().iloc[:0].to_parquet(d / "d.parquet"),
    ),
    Row(
        "dataset-out-of-vocab",
        ("--input-file", "{tmp}/d.parquet"),
        r"token id 300000",
        make=parquet("d.parquet", tok_input=[[1, 300000], [2]]),
    ),
    Row(
        "dataset-negative-token",
        ("--input-file", "{tmp}/d.parquet"),
        r"token id -4 at position 1 is negative",
        make=parquet("d.parquet", tok_input=[[1, -4], [2]]),
    ),
    Row(
        "dataset-bad-output-len",
        ("--input-file", "{tmp}/d.parquet"),
        r"max_output_len.* is -3",
        make=parquet("d.parquet", max_output_len=[4, -3]),
    ),
    # ------------------------------------------------------------------ servers
    Row(
        "server-refused",
        (*HTTP, *REFUSED),
        r"cannot reach the sglang server at http://127\.0\.0\.1:\d+ "
        r"\(connection refused",
    ),
    Row(
        "server-unknown-host",
        (*HTTP, "--server-url", "http://no-such-host.invalid:30000"),
        r"cannot reach the sglang server at http://no-such-host\.invalid:30000 \(host not found",
    ),
    Row(
        "server-503-forever",
        (*HTTP, "--server-url", "{fault}/unhealthy", "--ready-timeout", "2"),
        r"sglang server .*/unhealthy not ready after 2 s \(GET /health: HTTP 503: still loading\)",
    ),
    Row(
        "server-openai-503-forever",
        (
            "--backend",
            "openai",
            "--input-file",
            SAMPLE,
            "--server-url",
            "{fault}/unhealthy",
            "--ready-timeout",
            "2",
        ),
        r"not ready after 2 s",
    ),
    Row("server-url-not-a-url", (*HTTP, "--server-url", "not-a-url"), r"--server-url.*not-a-url"),
    # ------------------------------------------------------------------ output directories
    Row(
        "output-dir-is-a-file",
        (*HTTP, *REFUSED, "--output-dir", "{tmp}/f"),
        r"--output-dir .*f",
        make=text("f", "a file"),
    ),
    Row(
        "output-dir-under-a-file",
        (*HTTP, *REFUSED, "--output-dir", "{tmp}/f/out"),
        r"--output-dir .*f",
        make=text("f", "a file"),
    ),
    Row(
        "output-dir-unwritable",
        (*HTTP, *REFUSED, "--output-dir", "/proc/gptoss-mlperf-out"),
        r"--output-dir .*/proc/gptoss-mlperf-out",
    ),
    # ------------------------------------------------------------------ checkpoints
    Row("checkpoint-missing", ("--model-path", "{tmp}/no-ckpt"), r"no-ckpt"),
    Row(
        "checkpoint-corrupt-config",
        ("--model-path", "{tmp}/ckpt"),
        r"ckpt.*config.json",
        make=checkpoint("config"),
    ),
    Row(
        "checkpoint-truncated-weights",
        ("--model-path", "{tmp}/ckpt"),
        r"ckpt.*safetensors",
        make=checkpoint("weights"),
    ),
    Row(
        "checkpoint-without-weights",
        ("--model-path", "{tmp}/ckpt"),
        r"ckpt.*safetensors",
        make=checkpoint("no_weights"),
    ),
]


# ----------------------------------------------------------------------------- running a row


@pytest.fixture(scope="module")
def fault_url():
    proc = subprocess.Popen([sys.executable, str(FAULT_SERVER)], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("PORT "), line
    yield f"http://127.0.0.1:{line.split()[1]}"
    proc.kill()
    proc.wait()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True, slots=True)
class Outcome:
    code: int
    stdout: str
    stderr: str
    wall_s: float

    @property
    def error_lines(self) -> list[str]:
        return [
            line for line in (self.stdout + "\n" + self.stderr).splitlines() if line.startswith("error: ")
        ]


def run_mlperf(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> Outcome:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200", **(env or {})}
    env.pop("MLPERF_BACKEND", None)
    env.pop("TRITON_INTERPRET", None)  # the kernel tests' conftest sets it in this process
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "run_mlperf.py"), *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=WALL_S,
    )
    return Outcome(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - t0)


def assert_refused(out: Outcome, code: int, check: str) -> None:
    """The invariants of every bad input."""
    shown = f"exit {out.code}\n--- stdout\n{out.stdout[-3000:]}\n--- stderr\n{out.stderr[-3000:]}"
    assert "Traceback" not in out.stderr and "Traceback" not in out.stdout, shown
    assert out.code == code, shown
    assert len(out.error_lines) == 1, shown
    assert re.search(check, out.error_lines[0]), f"{check!r} not in {out.error_lines[0]!r}"
    assert out.wall_s < WALL_S


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory, fault_url) -> dict[str, tuple[Outcome, Path]]:
    """Every row's run, four at a time (each is mostly interpreter start-up): row id -> (outcome, its
    --output-dir)."""
    from concurrent.futures import ThreadPoolExecutor

    from gptoss.tools.make_checkpoint import preset_config, write_checkpoint

    root = tmp_path_factory.mktemp("rows")
    if any(r.id.startswith("checkpoint-") for r in ROWS):
        write_checkpoint(preset_config("tiny"), root / "tiny-good", seed=0)

    def one(row: Row) -> tuple[Outcome, Path]:
        work = root / row.id / "row"
        work.mkdir(parents=True)
        if row.make is not None:
            row.make(work)
        fill = {"tmp": str(work), "fault": fault_url, "refused": f"http://127.0.0.1:{free_port()}"}
        argv = [a.format(**fill) for a in row.argv]
        out_dir = root / row.id / "out"  # a row that slips through writes no output/ in the checkout
        if "--output-dir" not in argv:
            argv += ["--output-dir", str(out_dir)]
        return run_mlperf(argv, root / row.id, env={"MLPERF_DATA_DIR": str(root / "data")}), out_dir

    with ThreadPoolExecutor(4) as pool:
        return dict(zip((r.id for r in ROWS), pool.map(one, ROWS), strict=True))


@pytest.mark.parametrize("row", [pytest.param(r, id=r.id) for r in ROWS])
def test_bad_input_is_one_error_line(row: Row, outcomes):
    out, out_dir = outcomes[row.id]
    assert_refused(out, row.code, row.check)
    assert not list(out_dir.rglob("mlperf_log_*")), "LoadGen started"


def test_no_row_id_is_repeated():
    ids = [r.id for r in ROWS]
    assert len(ids) == len(set(ids))


# ----------------------------------------------------------------------------- generated bad inputs

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

# (flag, what a bad value is refused for, the text naming it)
FLOAT_FLAGS = [
    ("--target-qps", "target.qps"),
    ("--min-duration", "min.duration"),
    ("--timeout", "timeout"),
    ("--interrupt-grace", "interrupt.grace"),
]
INT_FLAGS = [
    ("--min-query-count", "min.query.count"),
    ("--max-new-tokens", "max.new.tokens"),
    ("--max-concurrency", "max.concurrency"),
    ("--max-samples", "max.samples"),
]


def _not_a_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return True
    return False


not_numbers = st.text(alphabet="abcxyz-+.,e_ 0123456789%$", min_size=1, max_size=8).filter(
    lambda s: _not_a_number(s) and not s.startswith("-")  # "-x" reads as a flag: argparse's own path
)
negatives = st.one_of(
    st.integers(max_value=-1).map(str),
    st.floats(max_value=-1e-9, allow_nan=False, allow_infinity=False).map(repr),
)
finite_bad_float = st.one_of(not_numbers, negatives)
bad_int = st.one_of(
    not_numbers,
    negatives,
    st.just("0"),
    st.floats(min_value=0.5, max_value=1e6).filter(lambda x: x != int(x)).map(repr),
)


def _in_process(argv: list[str]) -> Outcome:
    """main() in this process (a subprocess per example is too slow), its stdout and stderr captured."""
    import contextlib
    import io

    from harness.cli import main

    out, err = io.StringIO(), io.StringIO()
    t0 = time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["run_mlperf.py", *argv])
        except SystemExit as e:
            code = e.code
        except Exception:  # a traceback: the invariant below fails with it in view
            import traceback

            traceback.print_exc(file=err)
            code = -1
    return Outcome(code, out.getvalue(), err.getvalue(), time.monotonic() - t0)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.one_of(
        st.tuples(st.sampled_from(FLOAT_FLAGS), finite_bad_float),
        st.tuples(st.sampled_from(INT_FLAGS), bad_int),
    )
)
def test_generated_bad_flag_values_are_one_error_line(tmp_path, case):
    (flag, name), value = case
    # A value that slipped through would reach only a refused server, never a model or LoadGen.
    port = free_port()
    argv = [
        "--backend",
        "sglang",
        "--input-file",
        SAMPLE,
        "--server-url",
        f"http://127.0.0.1:{port}",
        "--output-dir",
        str(tmp_path / "out"),
        f"{flag}={value}",
    ]
    assert_refused(_in_process(argv), 2, name)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.sampled_from(
        FLOAT_FLAGS
        + [
            ("--ready-timeout", "ready.timeout"),
            ("--connect-timeout", "connect.timeout"),
            ("--first-token-timeout", "first.token.timeout"),
        ]
    ),
    st.sampled_from(["inf", "-inf", "nan", "1e400", "-1e400", "Infinity"]),
)
def test_generated_non_finite_flag_values_are_one_error_line(tmp_path, flag, value):
    # A subprocess each: an infinite rate that slipped through would crash LoadGen, not just fail.
    argv = [
        "--backend",
        "sglang",
        "--input-file",
        SAMPLE,
        "--server-url",
        f"http://127.0.0.1:{free_port()}",
        "--output-dir",
        str(tmp_path / "out"),
        f"{flag[0]}={value}",
    ]
    assert_refused(run_mlperf(argv, tmp_path), 2, flag[1])


# A malformed cell of one column; every other cell stays good. Stored as a pickle: parquet would
# convert a mixed column as a whole (or refuse it), a pickle keeps the one bad cell as it is.
bad_cells = st.one_of(
    st.tuples(
        st.just("tok_input"),
        st.one_of(
            st.text(max_size=5),  # text, not ids
            st.none(),
            st.integers(0, 100),  # one id, not a list
            st.lists(st.integers(max_value=-1), min_size=1, max_size=3),  # negative ids
            st.lists(
                st.integers(min_value=201088, max_value=2**40), min_size=1, max_size=3
            ),  # beyond the vocabulary
            st.just([]),  # an empty prompt
            st.lists(
                st.one_of(st.floats(allow_nan=True), st.text(max_size=2), st.booleans()),
                min_size=1,
                max_size=3,
            ),
            st.lists(st.lists(st.integers(0, 10), min_size=1, max_size=2), min_size=1, max_size=2),  # nested
        ),
    ),
    st.tuples(
        st.just("max_output_len"),
        st.one_of(
            st.integers(max_value=0),
            st.just(float("nan")),
            st.none(),
            st.floats(0.5, 1e6).filter(lambda x: x != int(x)),
            st.text(min_size=1, max_size=5),
            st.booleans(),
        ),
    ),
    st.tuples(st.just("dataset"), st.one_of(st.none(), st.integers(), st.floats(allow_nan=True))),
    st.tuples(st.just("tok_input_len"), st.one_of(st.integers(4, 10**6), st.none(), st.just(float("nan")))),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bad_cells, st.integers(0, 2))
def test_generated_malformed_dataset_cells_are_one_error_line(tmp_path, cell, row):
    column, value = cell
    frame = _frame(
        tok_input=[[200006, 17360, 200008]] * 3,
        tok_input_len=[3, 3, 3],
        dataset=["gpqa_diamond", "aime25", "livecodebench_v6"],
        ground_truth=["A", "7", "abc001_a"],
        max_output_len=[4, 4, 4],
    )
    cells = list(frame[column])
    cells[row] = value
    frame[column] = pd.Series(cells, dtype=object)
    path = tmp_path / "d.pkl"
    frame.to_pickle(path)
    argv = [
        "--backend",
        "sglang",
        "--input-file",
        str(path),
        "--server-url",
        f"http://127.0.0.1:{free_port()}",
        "--output-dir",
        str(tmp_path / "out"),
    ]
    out = _in_process(argv)
    assert_refused(out, 2, rf"d\.pkl: row {row}, column '{column}'")

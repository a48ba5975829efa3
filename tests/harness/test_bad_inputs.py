"""Every mistake a user can make ends the same way: exit 2, one line `error: ...` naming the problem,
no traceback, and no wait. One table row per mistake (flags, conf files, datasets, servers, output
directories, checkpoints), each run as `python run_mlperf.py ...` in a process of its own, so that a
crash (LoadGen segfaults on an infinite rate) fails the row instead of the test session.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.harness.refusalkit import ROOT, SAMPLE, Outcome, assert_refused, frame, free_port, run_mlperf

FAULT_SERVER = ROOT / "tests" / "backends" / "fault_server.py"

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


def parquet(name: str, **columns) -> Callable[[Path], None]:
    return lambda d: frame(**columns).to_parquet(d / name)


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
        make=lambda d: frame().iloc[:0].to_parquet(d / "d.parquet"),
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

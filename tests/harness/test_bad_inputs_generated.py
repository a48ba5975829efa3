"""Generated bad inputs (hypothesis): flag values that are not numbers, negative, zero or not finite,
and malformed dataset cells, each refused as every hand-written mistake is (test_bad_inputs.py)."""

from __future__ import annotations

import time

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.harness.refusalkit import SAMPLE, Outcome, assert_refused, frame, free_port, run_mlperf

pytestmark = pytest.mark.timeout(600)


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
        except Exception:  # noqa: BLE001 - a traceback: the invariant below fails with it in view
            import traceback

            traceback.print_exc(file=err)
            code = -1
    return Outcome(code, out.getvalue(), err.getvalue(), time.monotonic() - t0)


def _refused_server_argv(tmp_path, input_file, *extra: str) -> list[str]:
    """sglang at a free port nobody listens on: a bad value that slipped through reaches only a refused
    server, never a model or LoadGen."""
    argv = ["--backend", "sglang", "--input-file", str(input_file)]
    argv += ["--server-url", f"http://127.0.0.1:{free_port()}", "--output-dir", str(tmp_path / "out")]
    return [*argv, *extra]


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
    argv = _refused_server_argv(tmp_path, SAMPLE, f"{flag}={value}")
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
    argv = _refused_server_argv(tmp_path, SAMPLE, f"{flag[0]}={value}")
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
    df = frame(
        tok_input=[[200006, 17360, 200008]] * 3,
        tok_input_len=[3, 3, 3],
        dataset=["gpqa_diamond", "aime25", "livecodebench_v6"],
        ground_truth=["A", "7", "abc001_a"],
        max_output_len=[4, 4, 4],
    )
    cells = list(df[column])
    cells[row] = value
    df[column] = pd.Series(cells, dtype=object)
    path = tmp_path / "d.pkl"
    df.to_pickle(path)
    argv = _refused_server_argv(tmp_path, path)
    out = _in_process(argv)
    assert_refused(out, 2, rf"d\.pkl: row {row}, column '{column}'")

"""Grade generated programs against LiveCodeBench test cases, each case in its own sandbox."""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from evaluation.lcb_tests import LcbTestsError, Problem, TestCase
from evaluation.sandbox import Sandbox, Status


@dataclass(frozen=True, slots=True)
class Verdict:
    passed: bool
    status: str  # "passed", "wrong_answer", or the sandbox Status of the failing case
    cases_run: int
    failed_case: int | None = None
    detail: str = ""


def stripped_lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().split("\n")]


def stdout_matches(got: str, expected: str) -> bool:
    """LiveCodeBench's rule: same number of lines; each line equal after strip, or equal as a list
    of Decimals (so 0.50 == 0.5 but 50000000000000001 != 50000000000000000)."""
    got_lines, want_lines = stripped_lines(got), stripped_lines(expected)
    if len(got_lines) != len(want_lines):
        return False
    for g, w in zip(got_lines, want_lines, strict=True):
        if g == w:
            continue
        try:
            if [Decimal(x) for x in g.split()] != [Decimal(x) for x in w.split()]:
                return False
        except InvalidOperation:  # unequal text that is not numbers either: a wrong line
            return False
    return True


def functional_args(case: TestCase, qid: str) -> tuple[list, object]:
    try:
        return [json.loads(line) for line in case.input.split("\n")], json.loads(case.output)
    except json.JSONDecodeError as e:
        raise LcbTestsError(f"{qid}: functional test is not JSON ({e})") from None


def run_case(sandbox: Sandbox, code: str, problem: Problem, case: TestCase) -> tuple[str, str]:
    """(status, detail) of one test case: "passed", "wrong_answer" or a sandbox failure."""
    if case.testtype == "stdin":
        result = sandbox.run(code, stdin=case.input.encode())
    else:
        args, expected = functional_args(case, problem.question_id)
        result = sandbox.run(code, fn_name=problem.fn_name, args=args)
    if result.status is not Status.OK:
        return str(result.status), result.detail
    if case.testtype == "stdin":
        got = result.stdout.decode("utf-8", errors="replace")
        if stdout_matches(got, case.output):
            return "passed", ""
        return "wrong_answer", f"got {clip(got)!r}, expected {clip(case.output)!r}"
    try:
        value = json.loads(result.stdout)["value"]
    except (ValueError, KeyError, TypeError):  # only the program itself can have garbled its result
        return "wrong_answer", f"malformed result {clip(result.stdout.decode(errors='replace'))!r}"
    if value == expected:
        return "passed", ""
    return "wrong_answer", f"returned {clip(json.dumps(value))}, expected {clip(case.output)}"


def grade_program(sandbox: Sandbox, code: str, problem: Problem) -> Verdict:
    """All cases in order, stopping at the first failure, as LiveCodeBench does."""
    for i, case in enumerate(problem.tests):
        status, detail = run_case(sandbox, code, problem, case)
        if status != "passed":
            return Verdict(False, status, i + 1, i, detail)
    return Verdict(True, "passed", len(problem.tests))


def grade_many(
    jobs: dict[Hashable, tuple[str, Problem]],
    sandbox: Sandbox,
    workers: int,
    on_done: Callable[[], None] | None = None,
) -> dict[Hashable, Verdict]:
    """Grade programs in parallel. Each case runs in a fresh sandbox with its own directory, so
    workers never share one; a thread pool suffices since the work happens in child processes."""
    verdicts: dict[Hashable, Verdict] = {}
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="lcb") as pool:
        futures = {
            pool.submit(grade_program, sandbox, code, problem): key for key, (code, problem) in jobs.items()
        }
        try:
            for future in as_completed(futures):
                verdicts[futures[future]] = future.result()
                if on_done:
                    on_done()
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)  # a broken test file: stop, do not grade on
            raise
    return verdicts


def clip(text: str, n: int = 120) -> str:
    return text if len(text) <= n else text[: n // 2] + " ... " + text[-n // 2 :]

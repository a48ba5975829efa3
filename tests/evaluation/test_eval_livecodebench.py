"""LiveCodeBench: test-file formats (ours and the official release), output comparison, grading."""

import base64
import json
import pickle
import zlib

import pytest

from evaluation.lcb_tests import LcbTestsError, Problem, load_lcb_tests
from evaluation.lcb_tests import TestCase as Case
from evaluation.lcb_tests import main as convert
from evaluation.livecodebench import grade_many, grade_program, stdout_matches
from evaluation.sandbox import Limits, Sandbox
from tests.evaluation.evalkit import SUM, TWO_SUM, write_dataset, write_lcb_tests


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    return Sandbox(Limits(wall_s=2.0, memory_bytes=512 << 20), base_dir=tmp_path_factory.mktemp("cases"))


def problem(row: dict) -> Problem:
    return Problem(row["question_id"], row["fn_name"], tuple(Case(**t) for t in row["tests"]))


@pytest.mark.parametrize(
    "got, expected, same",
    [
        ("3\n", "3", True),
        ("  3  \n\n", "3\n", True),
        ("1 2\n3\n", "1 2\n3", True),
        ("0.50\n", "0.5\n", True),
        ("1e3", "1000", True),
        ("50000000000000001", "50000000000000000", False),
        ("3\n4\n", "3\n", False),
        ("yes", "Yes", False),
        ("1 2", "1  2", True),  # split() ignores runs of blanks
        ("", "", True),
    ],
)
def test_stdout_comparison_follows_livecodebench(got, expected, same):
    assert stdout_matches(got, expected) is same


def test_stdin_program_right_wrong_and_failing(sandbox):
    p = problem(SUM)
    right = grade_program(sandbox, "a, b = map(int, input().split())\nprint(a + b)", p)
    assert (right.passed, right.status, right.cases_run) == (True, "passed", 3)
    wrong = grade_program(sandbox, "a, b = map(int, input().split())\nprint(abs(a) + abs(b))", p)
    assert (wrong.passed, wrong.status, wrong.failed_case, wrong.cases_run) == (False, "wrong_answer", 1, 2)
    assert wrong.detail == "got '14\\n', expected '6'"
    crash = grade_program(sandbox, "print(undefined_name)", p)
    assert (crash.status, crash.failed_case) == ("runtime_error", 0)
    assert crash.detail == "NameError: name 'undefined_name' is not defined"
    slow = grade_program(sandbox, "while True:\n    pass", p)
    assert (slow.status, slow.cases_run) == ("timeout", 1)


def test_functional_program(sandbox):
    p = problem(TWO_SUM)
    code = (
        "class Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n"
        "        seen = {}\n        for i, x in enumerate(nums):\n"
        "            if target - x in seen:\n                return (seen[target - x], i)\n"
        "            seen[x] = i\n"
    )
    right = grade_program(sandbox, code, p)
    assert (right.passed, right.cases_run) == (True, 2)  # a tuple counts as the list, as in LCB
    wrong = grade_program(sandbox, code.replace("(seen[target - x], i)", "[i, seen[target - x]]"), p)
    assert (wrong.status, wrong.failed_case, wrong.detail) == (
        "wrong_answer",
        0,
        "returned [1, 0], expected [0, 1]",
    )
    unjsonable = grade_program(
        sandbox, "class Solution:\n    def twoSum(self, nums, target):\n        return {0, 1}", p
    )
    assert unjsonable.status == "wrong_answer"
    missing = grade_program(sandbox, "class Solution:\n    pass", p)
    assert missing.status == "runtime_error" and "twoSum" in missing.detail


def test_malformed_functional_test_is_an_error(sandbox):
    broken = problem({**TWO_SUM, "tests": [{"input": "[1,", "output": "[0]", "testtype": "functional"}]})
    with pytest.raises(LcbTestsError, match="lc1: functional test is not JSON"):
        grade_program(sandbox, "class Solution:\n    def twoSum(self, a, b):\n        return [0]", broken)


def test_grade_many_in_parallel(sandbox):
    right = "a, b = map(int, input().split())\nprint(a + b)"
    jobs = {i: (right if i % 2 == 0 else "print(0)", problem(SUM)) for i in range(6)}
    verdicts = grade_many(jobs, sandbox, workers=3)
    assert {i: v.passed for i, v in verdicts.items()} == {
        0: True,
        1: False,
        2: True,
        3: False,
        4: True,
        5: False,
    }


def release_row(row: dict, private_as_blob: bool) -> dict:
    """A row as livecodebench/code_generation_lite ships it."""
    public, private = row["tests"][:1], row["tests"][1:]
    private_json = json.dumps(private)
    blob = (
        base64.b64encode(zlib.compress(pickle.dumps(private_json))).decode()
        if private_as_blob
        else private_json
    )
    return {
        "question_title": "t",
        "question_content": "c",
        "platform": "atcoder",
        "question_id": row["question_id"],
        "contest_id": "abc001",
        "contest_date": "2024-08-01T00:00:00",
        "starter_code": "",
        "difficulty": "easy",
        "public_test_cases": json.dumps(public),
        "private_test_cases": blob,
        "metadata": json.dumps({"func_name": row["fn_name"]} if row["fn_name"] else {}),
    }


def test_load_our_format_and_the_official_release(tmp_path):
    ours = write_lcb_tests(tmp_path / "ours.jsonl", [SUM, TWO_SUM])
    loaded = load_lcb_tests(ours)
    assert loaded == {"abc001_a": problem(SUM), "lc1": problem(TWO_SUM)}
    assert load_lcb_tests(ours, wanted={"lc1"}) == {"lc1": problem(TWO_SUM)}

    as_object = tmp_path / "ours.json"
    as_object.write_text(
        json.dumps({r["question_id"]: {"fn_name": r["fn_name"], "tests": r["tests"]} for r in (SUM, TWO_SUM)})
    )
    assert load_lcb_tests(as_object) == loaded

    release = tmp_path / "release"
    release.mkdir()
    (release / "test.jsonl").write_text(json.dumps(release_row(SUM, private_as_blob=True)) + "\n")
    (release / "test2.jsonl").write_text(json.dumps(release_row(TWO_SUM, private_as_blob=False)) + "\n")
    assert load_lcb_tests(release) == loaded


def test_private_tests_pickle_may_not_run_code(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            import os

            return (os.system, (f"touch {marker}",))

    row = release_row(SUM, private_as_blob=False)
    row["private_test_cases"] = base64.b64encode(zlib.compress(pickle.dumps(Evil()))).decode()
    path = tmp_path / "test.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(LcbTestsError, match="references posix.system"):
        load_lcb_tests(path)
    assert not marker.exists()


@pytest.mark.parametrize(
    "row, message",
    [
        ({"fn_name": None, "tests": []}, "row without a question_id"),
        ({"question_id": "x", "fn_name": None, "tests": []}, "x: no test cases"),
        (
            {
                "question_id": "x",
                "fn_name": None,
                "tests": [{"input": "1", "output": "1", "testtype": "functional"}],
            },
            "functional tests need fn_name",
        ),
        ({"question_id": "x", "tests": [{"input": "1", "testtype": "stdin"}]}, "x: malformed test cases"),
        (
            {
                "question_id": "x",
                "fn_name": None,
                "tests": [{"input": "1", "output": "1", "testtype": "web"}],
            },
            "unknown testtype",
        ),
    ],
)
def test_malformed_test_files(tmp_path, row, message):
    path = write_lcb_tests(tmp_path / "t.jsonl", [row])
    with pytest.raises(LcbTestsError, match=message):
        load_lcb_tests(path)


def test_duplicate_question_ids_are_an_error(tmp_path):
    with pytest.raises(LcbTestsError, match="abc001_a appears twice"):
        load_lcb_tests(write_lcb_tests(tmp_path / "t.jsonl", [SUM, SUM]))


def test_converter_writes_our_format_for_the_dataset(tmp_path, capsys):
    release = tmp_path / "release"
    release.mkdir()
    (release / "test.jsonl").write_text(
        "".join(json.dumps(release_row(r, private_as_blob=True)) + "\n" for r in (SUM, TWO_SUM))
    )
    dataset = write_dataset(tmp_path / "data.parquet", [("livecodebench_v6", "lc1"), ("gpqa_diamond", "A")])
    out = tmp_path / "lcb_tests.jsonl"
    convert([str(release), "--output", str(out), "--dataset", str(dataset)])
    assert [json.loads(line) for line in out.read_text().splitlines()] == [TWO_SUM]
    assert "wrote 1 problems, 2 tests" in capsys.readouterr().out
    missing = write_dataset(tmp_path / "other.parquet", [("livecodebench_v6", "zzz_404")])
    with pytest.raises(SystemExit, match="1 question_ids of .* are not in .*: zzz_404"):
        convert([str(release), "--output", str(out), "--dataset", str(missing)])

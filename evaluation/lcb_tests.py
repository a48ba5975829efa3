"""LiveCodeBench test cases: read our JSONL/JSON format or the official code_generation_lite release.

Our format, one problem per JSONL line (or a JSON list of these, or a JSON object keyed by
question_id whose values hold fn_name and tests):

    {"question_id": "abc301_a", "fn_name": null,
     "tests": [{"input": "5\\nTTAAT\\n", "output": "T\\n", "testtype": "stdin"}, ...]}

stdin tests feed `input` to the program and compare its stdout with `output`. functional tests
(LeetCode) call Solution().<fn_name>(*args), one JSON argument per line of `input`, and compare
the return value with the JSON `output`.

Official release rows (test.jsonl ... test6.jsonl of livecodebench/code_generation_lite) are read
as they are: public_test_cases is JSON, private_test_cases is JSON or base64(zlib(pickle(JSON))),
metadata holds func_name. `python -m evaluation.lcb_tests` converts them into our format.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import pickle
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

TESTTYPES = ("stdin", "functional")


class LcbTestsError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class TestCase:
    input: str
    output: str
    testtype: str


@dataclass(frozen=True, slots=True)
class Problem:
    question_id: str
    fn_name: str | None
    tests: tuple[TestCase, ...]

    def __post_init__(self) -> None:
        if not self.tests:
            raise LcbTestsError(f"{self.question_id}: no test cases")
        kinds = {t.testtype for t in self.tests}
        if not kinds <= set(TESTTYPES):
            raise LcbTestsError(f"{self.question_id}: unknown testtype(s) {sorted(kinds - set(TESTTYPES))}")
        if "functional" in kinds and not self.fn_name:
            raise LcbTestsError(f"{self.question_id}: functional tests need fn_name")

    def to_json(self) -> dict:
        return {
            "question_id": self.question_id,
            "fn_name": self.fn_name,
            "tests": [{"input": t.input, "output": t.output, "testtype": t.testtype} for t in self.tests],
        }


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        raise LcbTestsError(
            f"private_test_cases pickle references {module}.{name}; only a plain string is allowed"
        )


def decode_private(blob: str) -> list:
    """The release stores private tests as JSON, or as base64(zlib(pickle(JSON string)))."""
    try:
        return json.loads(blob)
    except json.JSONDecodeError:  # noqa: S110 - the release's other form, decoded below (or it raises)
        pass
    text = _NoGlobals(io.BytesIO(zlib.decompress(base64.b64decode(blob.encode())))).load()
    if not isinstance(text, str):
        raise LcbTestsError(f"private_test_cases unpickled to {type(text).__name__}, expected a JSON string")
    return json.loads(text)


def problem_from_row(row: dict) -> Problem:
    """A row in our format, or an official release row."""
    qid = row.get("question_id")
    if not isinstance(qid, str) or not qid:
        raise LcbTestsError(f"row without a question_id (keys: {', '.join(sorted(row))})")
    try:
        if "public_test_cases" in row:
            cases = json.loads(row["public_test_cases"]) + decode_private(row["private_test_cases"])
            meta = row.get("metadata") or "{}"
            fn_name = (json.loads(meta) if isinstance(meta, str) else meta).get("func_name")
        else:
            cases, fn_name = row["tests"], row.get("fn_name")
        tests = tuple(TestCase(str(c["input"]), str(c["output"]), str(c["testtype"])) for c in cases)
    except (KeyError, TypeError, ValueError, zlib.error) as e:
        raise LcbTestsError(f"{qid}: malformed test cases ({type(e).__name__}: {e})") from None
    return Problem(qid, fn_name, tests)


def iter_rows(path: Path) -> Iterator[dict]:
    files = sorted(p for p in path.iterdir() if p.suffix in (".jsonl", ".json")) if path.is_dir() else [path]
    if not files:
        raise LcbTestsError(f"{path}: no .jsonl or .json files")
    for file in files:
        if file.suffix == ".jsonl":
            with open(file, encoding="utf-8") as f:
                for lineno, line in enumerate(f, 1):
                    if line.strip():
                        try:
                            yield json.loads(line)
                        except json.JSONDecodeError as e:
                            raise LcbTestsError(f"{file}:{lineno}: not JSON ({e})") from None
            continue
        data = json.loads(file.read_text(encoding="utf-8"))
        if isinstance(data, dict):
            yield from ({"question_id": qid, **value} for qid, value in data.items())
        elif isinstance(data, list):
            yield from data
        else:
            raise LcbTestsError(f"{file}: expected a JSON list or object")


def load_lcb_tests(path: Path, wanted: set[str] | None = None) -> dict[str, Problem]:
    """Problems keyed by question_id; with `wanted`, only those (the release is gigabytes)."""
    path = Path(path)
    if not path.exists():
        raise LcbTestsError(f"{path}: no such LiveCodeBench tests file")
    problems: dict[str, Problem] = {}
    for row in iter_rows(path):
        qid = row.get("question_id")
        if wanted is not None and qid not in wanted:
            continue
        problem = problem_from_row(row)
        if qid in problems:
            raise LcbTestsError(f"{path}: question_id {qid} appears twice")
        problems[qid] = problem
    return problems


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m evaluation.lcb_tests",
        description="Convert the official LiveCodeBench code_generation_lite release into our test file.",
    )
    parser.add_argument("release", type=Path, help="a release .jsonl file, or a folder of test*.jsonl files")
    parser.add_argument("--output", type=Path, required=True, help="where to write the JSONL test file")
    parser.add_argument("--dataset", type=Path, help="keep only the question_ids this dataset uses")
    args = parser.parse_args(argv)
    wanted = None
    if args.dataset:
        from evaluation.graders import family
        from evaluation.reference import load_reference

        wanted = {
            r.ground_truth for r in load_reference(args.dataset) if family(r.dataset) == "livecodebench"
        }
    problems = load_lcb_tests(args.release, wanted)
    if wanted is not None and (missing := wanted - problems.keys()):
        raise SystemExit(
            f"{len(missing)} question_ids of {args.dataset} are not in {args.release}: "
            f"{', '.join(sorted(missing)[:10])}"
        )
    with open(args.output, "w", encoding="utf-8") as f:
        for qid in sorted(problems):
            f.write(json.dumps(problems[qid].to_json()) + "\n")
    n_tests = sum(len(p.tests) for p in problems.values())
    print(f"wrote {len(problems)} problems, {n_tests} tests to {args.output}")


if __name__ == "__main__":
    main()

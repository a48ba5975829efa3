"""evaluate_run and the CLI on hand-written logs: exact scores, Server logs, ground truths = 100."""

import json
import pickle
import random
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import evaluation
from evaluation.accuracy_log import AccuracyLogError
from evaluation.reference import DatasetError
from tests.evaluation.evalkit import (
    SUM,
    TWO_SUM,
    harmony,
    run_loadgen,
    write_dataset,
    write_lcb_tests,
    write_log,
)

REPO = Path(evaluation.__file__).parents[1]
SUM_CODE = "a, b = map(int, input().split())\nprint(a + b)"
TWO_SUM_CODE = (
    "class Solution:\n    def twoSum(self, nums, target):\n        seen = {}\n"
    "        for i, x in enumerate(nums):\n            if target - x in seen:\n"
    "                return [seen[target - x], i]\n            seen[x] = i\n"
)


def code(text: str) -> str:
    return f"Here is my solution.\n```python\n{text}\n```"


# (dataset, ground truth, output tokens, correct?)
CASES = [
    ("aime25", "70", harmony("Hence \\boxed{70}."), True),
    ("aime25", "70", harmony("Answer: 69"), False),
    ("aime25", "70", harmony(None, analysis="The sum is 7"), False),  # truncated: no final channel
    ("aime25", "70", harmony("Answer: 70", analysis="maybe \\boxed{12}"), True),
    ("gpqa_diamond", "B", harmony("**B**"), True),
    ("gpqa_diamond", "B", harmony("A"), False),
    ("gpqa_diamond", "B", harmony("I am not sure."), False),
    ("gpqa_diamond", "B", harmony("Answer: B"), True),
    ("gpqa_diamond", "B", harmony("b"), True),
    ("livecodebench_v6", "abc001_a", harmony(code(SUM_CODE)), True),
    ("livecodebench_v6", "abc001_a", harmony(code("print(0)")), False),
    ("livecodebench_v6", "abc001_a", harmony("I would use a loop."), False),  # no code block
    ("livecodebench_v6", "lc1", harmony(code(TWO_SUM_CODE)), True),
    ("livecodebench_v6", "abc001_a", harmony(code("while True:\n    pass")), False),
    ("livecodebench_v6", "lc1", harmony(code("class Solution(:")), False),
]
# (2/8 + 3/5 + 2/3) / (4/8 + 5/5 + 6/3) = (91/60) / (7/2) = 13/30
EXPECTED = 100 * 13 / 30


@pytest.fixture
def inputs(tmp_path):
    dataset = write_dataset(tmp_path / "data.parquet", [(d, g) for d, g, _, _ in CASES])
    tests = write_lcb_tests(tmp_path / "lcb.jsonl", [SUM, TWO_SUM])
    return tmp_path, dataset, tests


def evaluate(log, dataset, tests, tmp_path, **kw):
    return evaluation.evaluate_run(
        log, dataset, tmp_path / "result.json", lcb_tests=tests, lcb_timeout_s=2.0, quiet=True, **kw
    )


def test_hand_written_outputs_score_exactly(inputs):
    tmp_path, dataset, tests = inputs
    order = list(range(len(CASES)))
    random.Random(0).shuffle(order)  # LoadGen completes samples in any order
    log = write_log(tmp_path / "log.json", [c[2] for c in CASES], order=order)
    result = evaluate(log, dataset, tests, tmp_path)
    assert result["exact_match"] == pytest.approx(EXPECTED)
    assert not result["passed"] and result["valid"] and result["problems"] == []
    by_idx = {s["qsl_idx"]: s for s in result["samples"]}
    assert [by_idx[i]["correct"] for i in range(len(CASES))] == [c[3] for c in CASES]
    assert [by_idx[i]["extracted"] for i in range(4)] == ["70", "69", None, "70"]
    assert by_idx[11]["detail"] == "no code block"
    assert by_idx[13]["detail"].startswith("timeout on test 1/3")
    assert result["per_dataset"]["gpqa_diamond"] == {
        "correct": 3,
        "total": 5,
        "repeats": 5,
        "accuracy": 60.0,
        "component_score": 0.6,
        "max_component_score": 1.0,
        "ungraded": 0,
    }
    assert result["counts"]["without_final_channel"] == 1
    assert json.loads((tmp_path / "result.json").read_text())["exact_match"] == result["exact_match"]


def test_server_mode_log_scores_the_same(inputs):
    tmp_path, dataset, tests = inputs
    log = write_log(tmp_path / "server.json", [c[2] for c in CASES], server=True)
    assert "token_data" in json.loads(log.read_text())[0]
    assert evaluate(log, dataset, tests, tmp_path)["exact_match"] == pytest.approx(EXPECTED)


def test_real_loadgen_server_log_scores_the_same(inputs):
    tmp_path, dataset, tests = inputs
    log = run_loadgen(tmp_path / "lg", [c[2] for c in CASES], "server")
    assert evaluate(log, dataset, tests, tmp_path)["exact_match"] == pytest.approx(EXPECTED)


def ground_truth_output(dataset: str, truth: str) -> list[int]:
    """What a perfect model says: Harmony messages whose final channel holds the answer."""
    if dataset == "aime25":
        return harmony(f"The answer is $\\boxed{{{truth}}}$.")
    if dataset == "gpqa_diamond":
        return harmony(f"**{truth}**")
    return harmony(code({"abc001_a": SUM_CODE, "lc1": TWO_SUM_CODE}[truth]))


def test_log_built_from_ground_truths_scores_100(tmp_path):
    rows = (
        [("aime25", str(n)) for n in (0, 7, 204, 999)] * 2
        + [("gpqa_diamond", x) for x in "ABCD"]
        + [("livecodebench_v6", "abc001_a"), ("livecodebench_v6", "lc1")] * 3
    )
    dataset = write_dataset(tmp_path / "data.parquet", rows)
    tests = write_lcb_tests(tmp_path / "lcb.jsonl", [SUM, TWO_SUM])
    log = write_log(tmp_path / "log.json", [ground_truth_output(d, g) for d, g in rows])
    result = evaluate(log, dataset, tests, tmp_path)
    assert (result["exact_match"], result["passed"], result["valid"]) == (100.0, True, True)
    assert all(s["correct"] for s in result["samples"])

    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "evaluation",
            "--mlperf-log",
            str(log),
            "--reference-data",
            str(dataset),
            "--lcb-tests",
            str(tests),
            "--output",
            str(tmp_path / "cli.json"),
            "--lcb-timeout",
            "5",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert cli.returncode == 0, cli.stderr
    assert "'exact_match': 100.000" in cli.stdout and "PASS" in cli.stdout
    assert "livecodebench_v6" in cli.stdout  # the per-dataset table
    assert json.loads((tmp_path / "cli.json").read_text())["passed"] is True


def test_random_tokens_score_zero(tmp_path):
    rows = [("aime25", "70"), ("gpqa_diamond", "A"), ("livecodebench_v6", "abc001_a")] * 3
    dataset = write_dataset(tmp_path / "data.parquet", rows)
    rng = random.Random(1)
    log = write_log(tmp_path / "log.json", [[rng.randrange(0, 200000) for _ in range(300)] for _ in rows])
    # No code came out, so no test file is needed to know LiveCodeBench scored nothing.
    result = evaluation.evaluate_run(log, dataset, tmp_path / "r.json", quiet=True)
    assert (result["exact_match"], result["passed"], result["valid"]) == (0.0, False, True)


def test_missing_rows_fail_even_when_all_answers_are_right(tmp_path, capsys):
    rows = [("gpqa_diamond", "A"), ("gpqa_diamond", "B"), ("gpqa_diamond", "C")]
    dataset = write_dataset(tmp_path / "data.parquet", rows)
    log = write_log(tmp_path / "log.json", [harmony("A"), harmony("B")])  # the third never completed
    result = evaluation.evaluate_run(log, dataset, tmp_path / "r.json")
    assert result["exact_match"] == 100.0
    assert (result["passed"], result["valid"]) == (False, False)
    assert result["problems"] == ["1 of 3 dataset rows are missing from the log"]
    out = capsys.readouterr().out
    assert "problem: 1 of 3 dataset rows are missing from the log" in out and "FAIL" in out


def test_code_without_a_tests_file_is_not_scored(tmp_path):
    rows = [("livecodebench_v6", "abc001_a"), ("livecodebench_v6", "abc001_a"), ("gpqa_diamond", "A")]
    dataset = write_dataset(tmp_path / "data.parquet", rows)
    log = write_log(tmp_path / "log.json", [harmony(code(SUM_CODE)), harmony("no code"), harmony("A")])
    result = evaluation.evaluate_run(log, dataset, tmp_path / "r.json", quiet=True)
    assert result["exact_match"] is None and not result["passed"]
    assert result["problems"] == ["1 samples could not be graded"]
    assert [s["correct"] for s in result["samples"]] == [None, False, True]
    assert result["samples"][0]["detail"] == "not graded: no --lcb-tests file"


def test_question_missing_from_the_tests_file_is_not_scored(inputs):
    tmp_path, _, _ = inputs
    dataset = write_dataset(tmp_path / "d.parquet", [("livecodebench_v6", "zzz_404")])
    log = write_log(tmp_path / "log.json", [harmony(code(SUM_CODE))])
    result = evaluate(log, dataset, write_lcb_tests(tmp_path / "t.jsonl", [SUM]), tmp_path)
    assert result["exact_match"] is None
    assert result["samples"][0]["detail"].startswith("not graded: question_id zzz_404 is not in")


def test_pickle_dataset_through_the_restricted_unpickler(tmp_path):
    rows = [("gpqa_diamond", "A"), ("AIME25", "3")]  # dataset names are matched in lower case
    write_dataset(tmp_path / "data.parquet", rows)
    pkl = tmp_path / "data.pkl"
    pd.read_parquet(tmp_path / "data.parquet").to_pickle(pkl)
    log = write_log(tmp_path / "log.json", [harmony("A"), harmony("\\boxed{4}")])
    assert evaluation.evaluate_run(log, pkl, tmp_path / "r.json", quiet=True)["exact_match"] == pytest.approx(
        100 * (1 / 5) / (1 / 5 + 1 / 8)
    )


def test_malicious_pickle_is_refused(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            import os

            return (os.system, (f"touch {marker}",))

    (tmp_path / "evil.pkl").write_bytes(pickle.dumps(Evil()))
    log = write_log(tmp_path / "log.json", [harmony("A")])
    with pytest.raises(DatasetError, match="refusing to unpickle posix.system"):
        evaluation.evaluate_run(log, tmp_path / "evil.pkl", tmp_path / "r.json", quiet=True)
    assert not marker.exists()
    assert not evaluation.has_ground_truths(tmp_path / "evil.pkl")


def test_inputs_that_do_not_fit_together(tmp_path):
    dataset = write_dataset(tmp_path / "data.parquet", [("gpqa_diamond", "A")])
    beyond = write_log(tmp_path / "log.json", [harmony("A"), harmony("B")])
    with pytest.raises(AccuracyLogError, match=r"qsl_idx \[1\] beyond the 1 rows"):
        evaluation.evaluate_run(beyond, dataset, tmp_path / "r.json", quiet=True)
    pd.DataFrame({"dataset": ["gpqa_diamond"], "ground_truth": [None]}).to_parquet(tmp_path / "nogt.parquet")
    with pytest.raises(DatasetError, match="have no ground_truth"):
        evaluation.evaluate_run(
            write_log(tmp_path / "l1.json", [harmony("A")]),
            tmp_path / "nogt.parquet",
            tmp_path / "r.json",
            quiet=True,
        )
    assert not evaluation.has_ground_truths(tmp_path / "nogt.parquet")
    assert evaluation.has_ground_truths(dataset)
    pd.DataFrame({"tok_input": [[1]]}).to_parquet(tmp_path / "perf.parquet")
    with pytest.raises(DatasetError, match="missing column"):
        evaluation.evaluate_run(
            write_log(tmp_path / "l2.json", [harmony("A")]),
            tmp_path / "perf.parquet",
            tmp_path / "r.json",
            quiet=True,
        )


def test_token_ids_outside_the_vocabulary_invalidate_the_run(tmp_path):
    dataset = write_dataset(tmp_path / "data.parquet", [("gpqa_diamond", "A"), ("gpqa_diamond", "A")])
    log = write_log(tmp_path / "log.json", [harmony("A"), [200005, 300000]])
    result = evaluation.evaluate_run(log, dataset, tmp_path / "r.json", quiet=True)
    assert result["samples"][1]["detail"] == "invalid token id 300000"
    assert result["problems"] == ["1 samples hold token ids outside the vocabulary"] and not result["passed"]


def test_cli_reports_bad_input_with_exit_code_2(tmp_path):
    dataset = write_dataset(tmp_path / "data.parquet", [("gpqa_diamond", "A")])
    (tmp_path / "log.json").write_text("[{")
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "evaluation",
            "--mlperf-log",
            str(tmp_path / "log.json"),
            "--reference-data",
            str(dataset),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert cli.returncode == 2 and "error:" in cli.stderr and "not valid JSON" in cli.stderr


def test_generated_code_cannot_read_the_expected_outputs(inputs):
    from evaluation.sandbox import detect_isolation

    if detect_isolation() == "fallback":
        pytest.skip("hiding files needs a mount namespace")
    tmp_path, _, tests = inputs
    cheat = (
        "import json, sys\nstdin = sys.stdin.read()\n"
        f"for line in open({str(tests)!r}):\n"
        "    for case in json.loads(line)['tests']:\n"
        "        if case['input'] == stdin:\n            print(case['output'])\n"
    )
    dataset = write_dataset(tmp_path / "d.parquet", [("livecodebench_v6", "abc001_a")])
    log = write_log(tmp_path / "log.json", [harmony(code(cheat))])
    result = evaluate(log, dataset, tests, tmp_path)
    assert result["exact_match"] == 0.0
    assert "FileNotFoundError" in result["samples"][0]["detail"]


def test_result_records_the_sandbox_and_a_fallback_run_says_it_could_read_the_host(inputs, capsys):
    tmp_path, _, tests = inputs
    dataset = write_dataset(tmp_path / "d.parquet", [("livecodebench_v6", "abc001_a")])
    log = write_log(tmp_path / "log.json", [harmony(code("print(sum(map(int, input().split())))"))])
    result = evaluation.evaluate_run(
        log, dataset, tmp_path / "r.json", lcb_tests=tests, lcb_timeout_s=2.0, isolation="fallback"
    )
    assert result["sandbox_isolation"] == "fallback"
    assert "sandbox: fallback (no Linux namespaces here)" in capsys.readouterr().out
    from evaluation.sandbox import detect_isolation

    assert evaluate(log, dataset, tests, tmp_path)["sandbox_isolation"] == detect_isolation()

"""Compliance TEST07 / TEST09: the official audit.config drives real LoadGen; the verifiers pass and
fail on constructed logs and write what the submission checker reads."""

import json

import pytest

from evaluation.compliance import read_audit_config, verify, write_audit_config
from tests.evaluation.evalkit import harmony, run_loadgen, write_dataset, write_log

# The settings of mlcommons/inference compliance/TEST07|TEST09/gpt-oss-120b/audit.config.
OFFICIAL = {
    "TEST07": {
        "mode": "2",
        "accuracy_log_rng_seed": "720381539243781796",
        "accuracy_log_sampling_target": "990",
        "min_query_count": "990",
        "min_duration": "0",
        "performance_issue_unique": "1",
        "sample_concatenate_permutation": "0",
        "test07_accuracy_threshold": "60.698",
    },
    "TEST09": {
        "mode": "2",
        "accuracy_log_rng_seed": "720381539243781796",
        "accuracy_log_sampling_target": "10000",
        "min_query_count": "6396",
        "min_duration": "0",
        "performance_issue_unique": "1",
        "sample_concatenate_permutation": "0",
        "test09_min_output_tokens": "1150.38",
        "test09_max_output_tokens": "1406.02",
    },
}


def checker_accepts(output_dir, test) -> bool:
    """What tools/submission/submission_checker/checks/compliance_check.py looks for."""
    test_dir = output_dir / test
    name = "verify_accuracy.txt" if test == "TEST07" else "verify_output_len.txt"
    return test_dir.is_dir() and (test_dir / name).is_file() and "TEST PASS" in (test_dir / name).read_text()


@pytest.mark.parametrize("test", ["TEST07", "TEST09"])
def test_audit_config_holds_the_official_settings(tmp_path, test):
    path = write_audit_config(test.lower(), tmp_path)
    assert path == tmp_path / "audit.config"
    assert read_audit_config(path) == OFFICIAL[test]
    assert all(line.startswith(("#", "*.*.")) for line in path.read_text().splitlines())
    with pytest.raises(ValueError, match="unknown compliance test 'TEST01'"):
        write_audit_config("TEST01", tmp_path)


GPQA = "ABCD"


def gpqa_run(tmp_path, right_per_ten: int):
    """A real LoadGen TEST07 run on 990 GPQA rows where `right_per_ten` of every ten answers are right."""
    truths = [GPQA[i % 4] for i in range(990)]
    dataset = write_dataset(tmp_path / "gpqa.parquet", [("gpqa_diamond", t) for t in truths])
    outputs = [
        harmony(f"**{t if i % 10 < right_per_ten else GPQA[(i + 1) % 4]}**") for i, t in enumerate(truths)
    ]
    logs = tmp_path / "logs"
    logs.mkdir()
    run_loadgen(logs, outputs, "offline", write_audit_config("TEST07", logs))
    return logs, dataset


def test_test07_real_loadgen_run_passes_at_70_percent(tmp_path):
    logs, dataset = gpqa_run(tmp_path, right_per_ten=7)
    detail = (logs / "mlperf_log_detail.txt").read_text()
    assert "Found Audit Config file" in detail
    assert '"key": "effective_performance_issue_unique", "value": true' in detail
    entries = json.loads((logs / "mlperf_log_accuracy.json").read_text())
    assert sorted(e["qsl_idx"] for e in entries) == list(range(990))  # every sample once, all logged

    out = tmp_path / "submission"
    assert verify("TEST07", out, log_dir=logs, dataset=dataset) is True
    text = (out / "TEST07" / "verify_accuracy.txt").read_text()
    assert "'exact_match': 70.000" in text
    assert text.endswith(
        "Accuracy score: 70.000\nAccuracy threshold: 60.698\nAll samples logged and graded: True\n"
        "Accuracy check pass: True\nTEST PASS\n"
    )
    assert checker_accepts(out, "TEST07")
    assert (out / "TEST07" / "accuracy" / "mlperf_log_accuracy.json").read_bytes() == (
        logs / "mlperf_log_accuracy.json"
    ).read_bytes()
    assert sorted(p.name for p in (out / "TEST07" / "performance" / "run_1").iterdir()) == [
        "mlperf_log_detail.txt",
        "mlperf_log_summary.txt",
    ]


def test_test07_fails_at_60_percent(tmp_path):
    logs, dataset = gpqa_run(tmp_path, right_per_ten=6)
    out = tmp_path / "submission"
    assert verify("TEST07", out, log_dir=logs, dataset=dataset) is False
    text = (out / "TEST07" / "verify_accuracy.txt").read_text()
    assert "Accuracy score: 60.000" in text and text.endswith("TEST FAIL\n") and "TEST PASS" not in text
    assert not checker_accepts(out, "TEST07")


def test_test07_fails_when_samples_are_missing(tmp_path):
    dataset = write_dataset(tmp_path / "gpqa.parquet", [("gpqa_diamond", "A")] * 4)
    write_log(tmp_path / "mlperf_log_accuracy.json", [harmony("A")] * 3)  # one sample was never logged
    assert verify("TEST07", tmp_path, dataset=dataset) is False
    text = (tmp_path / "TEST07" / "verify_accuracy.txt").read_text()
    assert "Accuracy score: 100.000" in text and "All samples logged and graded: False" in text
    assert text.endswith("TEST FAIL\n")
    with pytest.raises(ValueError, match="TEST07 needs the dataset"):
        verify("TEST07", tmp_path)


def lengths_log(path, lengths):
    return write_log(path, [[200005] + [100] * (n - 2) + [200002] for n in lengths])


@pytest.mark.parametrize(
    "lengths, passed",
    [
        ([1278] * 4, True),
        ([1000, 1556], True),  # mean 1278
        ([1150, 1151], True),  # mean 1150.5 >= 1150.38
        ([1150, 1150], False),  # below the 10% band
        ([1406, 1407], False),  # mean 1406.5 > 1406.02
        ([100, 5000], False),
    ],
)
def test_test09_mean_output_length(tmp_path, lengths, passed):
    lengths_log(tmp_path / "mlperf_log_accuracy.json", lengths)
    assert verify("TEST09", tmp_path) is passed
    text = (tmp_path / "TEST09" / "verify_output_len.txt").read_text()
    mean = sum(lengths) / len(lengths)
    assert f"Mean output tokens: {mean:.2f}\n" in text
    assert (
        f"Total samples: {len(lengths)}\n" in text
        and "Min threshold: 1150.38\nMax threshold: 1406.02\n" in text
    )
    assert text.endswith("TEST PASS\n" if passed else "TEST FAIL\n")
    assert checker_accepts(tmp_path, "TEST09") is passed
    assert (tmp_path / "TEST09" / "accuracy" / "mlperf_log_accuracy.json").is_file()


def test_test09_real_loadgen_run_with_short_outputs_fails(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    run_loadgen(logs, [[200005, 7, 200002]] * 6396, "offline", write_audit_config("TEST09", logs))
    assert len(json.loads((logs / "mlperf_log_accuracy.json").read_text())) == 6396
    assert verify("TEST09", tmp_path / "out", log_dir=logs) is False
    assert "Mean output tokens: 3.00" in (tmp_path / "out" / "TEST09" / "verify_output_len.txt").read_text()


def test_thresholds_come_from_a_given_audit_config(tmp_path):
    lengths_log(tmp_path / "mlperf_log_accuracy.json", [3, 3])
    custom = tmp_path / "custom.config"
    custom.write_text(
        "*.*.test09_min_output_tokens = 2  # inline comment\n*.*.test09_max_output_tokens = 4\n"
    )
    assert verify("TEST09", tmp_path, audit_config=custom) is True
    with pytest.raises(FileNotFoundError, match="left no accuracy log"):
        verify("TEST09", tmp_path / "empty")


def test_cli(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    import evaluation

    repo = Path(evaluation.__file__).parents[1]

    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "evaluation.compliance", *map(str, args)],
            capture_output=True,
            text=True,
            cwd=repo,
            timeout=120,
        )

    made = cli("audit-config", "TEST09", "--dir", tmp_path)
    assert made.returncode == 0 and made.stdout.strip() == str(tmp_path / "audit.config")
    lengths_log(tmp_path / "mlperf_log_accuracy.json", [1278, 1279])
    ok = cli("verify", "TEST09", "--output-dir", tmp_path / "out", "--log-dir", tmp_path)
    assert ok.returncode == 0 and "TEST PASS" in ok.stdout
    lengths_log(tmp_path / "mlperf_log_accuracy.json", [10, 10])
    bad = cli("verify", "TEST09", "--output-dir", tmp_path / "out", "--log-dir", tmp_path)
    assert bad.returncode == 1 and "TEST FAIL" in bad.stdout

"""The CLI: a superset of the MLCommons reference's flags, the backend from the environment,
generation settings, and the embedded default (each backend's own flags: test_cli_backend_flags.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import build_parser
from harness.generation import GenerationConfigError, load_sampling
from tests.harness.runkit import parse_cli

ROOT = Path(__file__).resolve().parents[2]


def test_help_works_without_heavy_imports_and_says_num_workers_is_ignored():
    code = (
        "import sys, io, contextlib\n"
        "from harness.cli import main\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n"
        "    try: main(['run_mlperf.py', '--help'])\n"
        "    except SystemExit as e: code = e.code\n"
        "print(buf.getvalue())\n"
        "print('exit:', code)\n"
        "print('heavy:', sorted(m for m in ('torch', 'vllm', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    for flag in (
        "--scenario",
        "--input-file",
        "--max-samples",
        "--mlperf-conf",
        "--user-conf",
        "--accuracy",
        "--output-dir",
        "--backend",
        "--server-url",
        "--generation-config",
        "--max-new-tokens",
        "--num-workers",
        "--max-concurrency",
        "--timeout",
        "--model-path",
        "--model-name",
        "--target-qps",
        "--min-duration",
        "--min-query-count",
        "--compliance",
    ):
        assert flag in out
    assert out.strip().endswith("exit: 0\nheavy: []")  # --help exits 0 (argparse's SystemExit)
    (num_workers,) = [a for a in build_parser()._actions if "--num-workers" in a.option_strings]
    assert "ignored" in num_workers.help


def test_a_reference_command_line_works_unchanged(fake_backend, tmp_path, monkeypatch):
    gen = tmp_path / "generation_config.json"
    gen.write_text(
        json.dumps(
            {"_comment": "reference", "max_new_tokens": 32768, "temperature": 1.0, "top_k": -1, "top_p": 1.0}
        )
    )
    conf = tmp_path / "user.conf"
    conf.write_text("gpt-oss-120b.Server.target_qps = 1\n")
    cfg = parse_cli(
        [
            "--scenario",
            "server",
            "--input-file",
            "data.parquet",
            "--max-samples",
            5,
            "--mlperf-conf",
            "inference/mlperf.conf",
            "--user-conf",
            conf,
            "--accuracy",
            "--output-dir",
            "res",
            "--backend",
            "fake",
            "--server-url",
            "http://a:1",
            "--server-url",
            "http://b:2",
            "--generation-config",
            gen,
            "--max-new-tokens",
            100,
            "--num-workers",
            4,
            "--max-concurrency",
            64,
            "--timeout",
            1200,
        ],
        monkeypatch=monkeypatch,
    )
    assert cfg.scenario == "server" and cfg.accuracy and cfg.backend == "fake"
    assert cfg.input_file == Path("data.parquet") and cfg.max_samples == 5
    assert cfg.mlperf_conf == Path("inference/mlperf.conf") and cfg.user_conf == conf
    assert cfg.output_dir == Path("res") and cfg.log_dir == Path("res/server/accuracy")
    assert cfg.server_urls == ("http://a:1", "http://b:2")
    assert cfg.sampling.max_new_tokens == 100  # the flag beats the file
    assert (cfg.max_concurrency, cfg.timeout_s) == (64, 1200)
    assert "--num-workers is ignored: every query runs on the SUT's one asyncio loop" in cfg.notes
    assert cfg.command[1:4] == ("--scenario", "server", "--input-file")


def test_backend_from_environment_and_the_flag_wins(fake_backend, monkeypatch):
    assert parse_cli([], env={"MLPERF_BACKEND": "fake"}, monkeypatch=monkeypatch).backend == "fake"
    monkeypatch.setenv("MLPERF_BACKEND", "nonsense")
    assert parse_cli(["--backend", "fake"]).backend == "fake"
    with pytest.raises(SystemExit):
        parse_cli([])  # MLPERF_BACKEND=nonsense is refused by name


def test_embedded_default_uses_the_bundled_data_and_short_settings(fake_backend, monkeypatch):
    cfg = parse_cli(["--backend", "fake"], monkeypatch=monkeypatch)
    assert cfg.input_file.name == "sample.parquet" and cfg.input_file.parent.name == "data"
    assert (cfg.min_duration_s, cfg.min_query_count, cfg.target_qps) == (0.0, 24, None)
    assert any("not a valid submission setting" in n for n in cfg.notes)
    srv = parse_cli(["--backend", "fake", "--scenario", "server", "--target-qps", 3])
    assert (srv.min_duration_s, srv.min_query_count, srv.target_qps) == (0.0, 120, 3.0)  # flags win
    assert srv.latency_percentile == 0.9
    assert any("judged at p90 instead of p99" in n for n in srv.notes)
    inter = parse_cli(["--backend", "fake", "--scenario", "interactive"])
    assert (inter.min_query_count, inter.target_qps, inter.latency_percentile) == (48, 1.0, 0.9)
    assert any("usually ends INVALID (exit 3) on a busy one" in n for n in inter.notes)
    real = parse_cli(["--backend", "fake", "--input-file", "x.parquet"])
    assert (real.min_duration_s, real.min_query_count, real.target_qps) == (None, None, None)
    assert real.latency_percentile is None
    own = parse_cli(["--backend", "fake", "--scenario", "server", "--user-conf", "user.conf"])
    assert (own.min_query_count, own.target_qps, own.latency_percentile) == (
        None,
        None,
        None,
    )  # the conf says


def test_embedded_server_smoke_run_is_judged_at_p90(fake_backend, tmp_path):
    """The smoke settings reach LoadGen, and the summary reports the percentile LoadGen judged."""
    from tests.harness.runkit import run_cli, run_json

    code = run_cli(
        ["--backend", "fake", "--scenario", "server", "--target-qps", 200, "--output-dir", tmp_path]
    )
    record = run_json(tmp_path / "server" / "performance")
    assert code == (0 if record["result"]["validity"] == "VALID" else 3)
    assert record["loadgen_settings"]["server_target_latency_percentile"] == pytest.approx(0.9)
    assert record["loadgen_settings"]["min_query_count"] == 120
    result = record["result"]
    assert result["target_percentile"] == pytest.approx(0.9)
    assert (
        0 < result["tpot_target_ns"] <= result["tpot_p99_ns"]
        and 0 < result["ttft_target_ns"] <= result["ttft_p99_ns"]
    )


def test_generation_config_defaults_and_modes(tmp_path):
    perf = load_sampling(None, accuracy=False)
    acc = load_sampling(None, accuracy=True)
    assert (perf.temperature, perf.top_p, perf.top_k, perf.max_new_tokens) == (1.0, 1.0, 0, 10240)
    assert acc.max_new_tokens == 32768
    assert load_sampling(None, accuracy=True, max_new_tokens=5).max_new_tokens == 5
    own = tmp_path / "g.json"
    own.write_text(json.dumps({"temperature": 0.0, "top_k": 1, "max_new_tokens_performance": 64}))
    s = load_sampling(own, accuracy=False)
    assert (s.temperature, s.top_k, s.max_new_tokens, s.greedy) == (0.0, 1, 64, True)
    assert load_sampling(own, accuracy=True).max_new_tokens == 32768


@pytest.mark.parametrize(
    "content, message",
    [
        ({"temprature": 1.0}, "unknown key(s) temprature"),
        ({"top_p": "1"}, "'top_p' must be a number, got '1'"),
        ({"top_p": 0}, "top_p must be in (0, 1], got 0.0"),
        ({"max_new_tokens": 10.5}, "'max_new_tokens' must be an integer, got 10.5"),
        ([1, 2], "must hold a JSON object, not list"),
    ],
)
def test_bad_generation_configs(tmp_path, content, message):
    path = tmp_path / "g.json"
    path.write_text(json.dumps(content))
    with pytest.raises(GenerationConfigError) as e:
        load_sampling(path, accuracy=False)
    assert message in str(e.value) and str(path) in str(e.value)


def test_missing_named_conf_exits_2_with_the_message(fake_backend, tmp_path, capsys):
    from tests.harness.runkit import run_cli

    assert (
        run_cli(["--backend", "fake", "--user-conf", tmp_path / "user.conf", "--output-dir", tmp_path]) == 2
    )
    assert f"error: --user-conf {tmp_path / 'user.conf'} does not exist" in capsys.readouterr().out


def test_run_json_records_command_settings_backend_and_versions(fake_backend, tmp_path, monkeypatch):
    from tests.harness.runkit import run_cli, run_json

    monkeypatch.setenv("GPTOSS_MOE_V3_TILES", "gate_up=256,64,64,8,5,half")
    monkeypatch.setenv("VLLM_API_KEY", "s3cret")  # never written down
    monkeypatch.setenv("HOME_AWAY", "x")  # not ours: left out
    assert run_cli(["--backend", "fake", "--output-dir", tmp_path, "--fake-delay", 0]) == 0
    record = run_json(tmp_path / "offline" / "performance")
    assert record["command"].endswith(
        "run_mlperf.py --backend fake --output-dir " + str(tmp_path) + " --fake-delay 0"
    )
    assert record["config"]["backend"] == "fake" and record["config"]["sampling"]["max_new_tokens"] == 10240
    assert record["loadgen_settings"]["min_query_count"] == 24
    assert record["backend"]["name"] == "fake"
    assert record["packages"]["mlcommons-loadgen"] == "6.0.17"
    assert record["dataset"]["rows"] == 24 and len(record["dataset"]["sha256"]) == 64
    assert record["result"]["validity"] == "VALID"
    assert record["env"]["GPTOSS_MOE_V3_TILES"] == "gate_up=256,64,64,8,5,half"
    assert "VLLM_API_KEY" not in record["env"] and "HOME_AWAY" not in record["env"]
    assert "s3cret" not in (tmp_path / "offline" / "performance" / "run.json").read_text()


def test_nonfinite_numbers_in_the_generation_config_are_refused(tmp_path):
    for text in ('{"temperature": NaN}', '{"top_p": Infinity}', '{"temperature": 1e400}'):
        path = tmp_path / "g.json"
        path.write_text(text)
        with pytest.raises(GenerationConfigError, match="must be a number"):
            load_sampling(path, accuracy=False)


@pytest.mark.parametrize(
    "extra,noted",
    [
        (["--scenario", "server"], True),
        (["--scenario", "interactive"], True),
        (["--scenario", "server", "--warmup", "8"], False),
        (["--scenario", "server", "--accuracy"], False),
        (["--scenario", "offline"], False),
    ],
)
def test_latency_runs_without_warmup_carry_a_note(fake_backend, monkeypatch, extra, noted):
    from harness.notes import WARMUP_NOTE

    cfg = parse_cli(["--backend", "fake", "--input-file", "d.parquet", *extra], monkeypatch=monkeypatch)
    assert (WARMUP_NOTE in cfg.notes) is noted

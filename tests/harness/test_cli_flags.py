"""The CLI: a superset of the MLCommons reference's flags, the backend from the environment,
generation settings, and the embedded default."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import build_parser, parse_config
from harness.generation import GenerationConfigError, load_sampling

ROOT = Path(__file__).resolve().parents[2]


def _config(argv: list, env: dict | None = None, monkeypatch=None):
    if monkeypatch is not None:
        monkeypatch.delenv("MLPERF_BACKEND", raising=False)
        for k, v in (env or {}).items():
            monkeypatch.setenv(k, v)
    return parse_config(["run_mlperf.py", *map(str, argv)])


def test_help_works_without_heavy_imports_and_says_num_workers_is_ignored():
    code = (
        "import sys, io, contextlib\n"
        "from harness.cli import main\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n"
        "    try: main(['run_mlperf.py', '--help'])\n"
        "    except SystemExit: pass\n"
        "print(buf.getvalue())\n"
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
    assert out.strip().endswith("heavy: []")
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
    cfg = _config(
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
    assert _config([], env={"MLPERF_BACKEND": "fake"}, monkeypatch=monkeypatch).backend == "fake"
    monkeypatch.setenv("MLPERF_BACKEND", "nonsense")
    assert _config(["--backend", "fake"]).backend == "fake"
    with pytest.raises(SystemExit):
        _config([])  # MLPERF_BACKEND=nonsense is refused by name


def test_embedded_default_uses_the_bundled_data_and_short_settings(fake_backend, monkeypatch):
    cfg = _config(["--backend", "fake"], monkeypatch=monkeypatch)
    assert cfg.input_file.name == "sample.parquet" and cfg.input_file.parent.name == "data"
    assert (cfg.min_duration_s, cfg.min_query_count, cfg.target_qps) == (0.0, 24, None)
    assert any("not a valid submission setting" in n for n in cfg.notes)
    srv = _config(["--backend", "fake", "--scenario", "server", "--target-qps", 3])
    assert (srv.min_duration_s, srv.min_query_count, srv.target_qps) == (0.0, 120, 3.0)  # flags win
    assert srv.latency_percentile == 0.9
    assert any("judged at p90 instead of p99" in n for n in srv.notes)
    inter = _config(["--backend", "fake", "--scenario", "interactive"])
    assert (inter.min_query_count, inter.target_qps, inter.latency_percentile) == (48, 1.0, 0.9)
    assert any("usually ends INVALID (exit 3) on a busy one" in n for n in inter.notes)
    real = _config(["--backend", "fake", "--input-file", "x.parquet"])
    assert (real.min_duration_s, real.min_query_count, real.target_qps) == (None, None, None)
    assert real.latency_percentile is None
    own = _config(["--backend", "fake", "--scenario", "server", "--user-conf", "user.conf"])
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


def test_run_json_records_command_settings_backend_and_versions(fake_backend, tmp_path):
    from tests.harness.runkit import run_cli, run_json

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


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--backend", "vllm", "--device", "cpu"],
            "--device has no effect with --backend vllm; remove it or choose the backend it belongs to",
        ),
        (
            ["--backend", "gptoss", "--server-url", "http://127.0.0.1:1", "--retries", "2"],
            "--server-url, --retries have no effect with --backend gptoss; "
            "remove them or choose the backend they belong to",
        ),
        (
            ["--backend", "sglang", "--no-stream", "--seed", "3"],
            "--seed has no effect with --backend sglang; remove it or choose the backend it belongs to "
            "(gptoss)",
        ),
        (
            ["--backend", "openai", "--max-num-seqs", "8"],
            "--max-num-seqs has no effect with --backend openai",
        ),
    ],
)
def test_a_flag_of_another_backend_is_refused_not_ignored(argv, message, capsys, monkeypatch):
    with pytest.raises(SystemExit) as e:
        _config(argv, monkeypatch=monkeypatch)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("error: ") and err.count("\n") == 1


def test_a_flag_means_what_its_backend_says(monkeypatch):
    from gptoss.engine import EngineConfig

    vllm_cfg = _config(
        ["--backend", "vllm", "--max-num-seqs", "8", "--dtype", "auto"], monkeypatch=monkeypatch
    )
    assert vllm_cfg.backend_options.engine_args == {"max_num_seqs": 8, "dtype": "auto"}  # only what was set
    gptoss_cfg = _config(["--backend", "gptoss", "--max-num-seqs", "8", "--device", "cpu", "--seed", "5"])
    # EngineConfig is the gptoss options, built whole; the model path is the runner's to fill in
    assert gptoss_cfg.backend_options == EngineConfig(device="cpu", max_num_seqs=8, seed=5)
    assert _config(["--backend", "gptoss"]).backend_options == EngineConfig()
    sglang = _config(["--backend", "sglang", "--stream-interval", "4", "--first-token-timeout", "0"])
    assert (sglang.backend_options.stream_interval, sglang.backend_options.first_token_timeout_s) == (4, None)


def test_help_shows_each_backends_own_flags_and_defaults(capsys):
    from harness.cli import main

    with pytest.raises(SystemExit) as e:
        main(["run_mlperf.py", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    gptoss = " ".join(out[out.index("--backend gptoss:") : out.index("--backend vllm:")].split())
    vllm = " ".join(out[out.index("--backend vllm:") : out.index("--backend sglang:")].split())
    assert "--dtype {bfloat16,float32}" in gptoss and "most running requests (default: 256)" in gptoss
    assert "--dtype {auto,half,float16,bfloat16,float,float32}" in vllm
    assert "256 on CPU" in vllm and "(default: 256)" not in vllm
    assert "--seed SEED" in gptoss and "--engine-seed" not in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--backend", "gptoss", "--dtype", "auto"], "argument --dtype: invalid choice: 'auto'"),
        (["--backend", "gptoss", "--engine-seed", "3"], "unrecognized arguments: --engine-seed 3"),
        (["--backend", "gptoss", "--max-num-seqs", "0"], "--max-num-seqs must be >= 1, got 0"),
        (["--backend", "gptoss", "--max-model-len", "1"], "--max-model-len must be >= 2, got 1"),
        (["--backend", "gptoss", "--device", "tpu"], "--device must be cpu or cuda, got 'tpu'"),
        (["--target-qps", "inf"], "argument --target-qps: expected a finite number, got 'inf'"),
        (["--target-qps", "1e400"], "argument --target-qps: expected a finite number, got '1e400'"),
        (["--min-duration", "nan"], "argument --min-duration: expected a finite number, got 'nan'"),
        (["--timeout=-inf"], "argument --timeout: expected a finite number, got '-inf'"),
        (["--interrupt-grace", "-1"], "argument --interrupt-grace: must be >= 0, got -1"),
        (["--max-samples", "1e3"], "argument --max-samples: expected an integer, got '1e3'"),
        (["--backend", "vllm", "--gpu-memory-utilization", "nan"], "expected a finite number, got 'nan'"),
        (["--backend", "sglang", "--ready-timeout", "Infinity"], "expected a finite number, got 'Infinity'"),
        (["--backend", "sglang", "--first-token-timeout", "inf"], "expected a finite number, got 'inf'"),
        (["--backend", "sglang", "--retries", "-1"], "--retries must be >= 0, got -1"),
        (
            ["--backend", "sglang", "--server-url", "not-a-url"],
            "--server-url 'not-a-url' is not an http(s) URL",
        ),
        (
            ["--backend", "openai", "--server-url", "http://:80"],
            "--server-url 'http://:80' is not an http(s) URL",
        ),
        (
            ["--backend", "openai", "--server-url", "http://h:99999"],
            "--server-url 'http://h:99999': Port out of range",
        ),
        (
            ["--backend", "openai", "--server-url", "ftp://h:1"],
            "is not an http(s) URL; give http://HOST:PORT",
        ),
        (
            ["--backend", "nope"],
            "--backend='nope' is not a backend; choose one of gptoss, vllm, sglang, openai",
        ),
        (["--max-num"], "unrecognized arguments: --max-num"),  # no abbreviations: a prefix is not a flag
    ],
)
def test_bad_flags_exit_2_with_one_error_line(argv, message, capsys, monkeypatch):
    with pytest.raises(SystemExit) as e:
        _config(argv, monkeypatch=monkeypatch)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err


def test_nonfinite_numbers_in_the_generation_config_are_refused(tmp_path):
    for text in ('{"temperature": NaN}', '{"top_p": Infinity}', '{"temperature": 1e400}'):
        path = tmp_path / "g.json"
        path.write_text(text)
        with pytest.raises(GenerationConfigError, match="must be a number"):
            load_sampling(path, accuracy=False)


def test_parse_options_builds_one_backends_options_from_its_flags():
    from backends.vllm_args import VllmOptions
    from harness.options import parse_options

    opts = parse_options(VllmOptions, ["--lora-modules", "a=/x", "--vllm-arg", "k=1", "--vllm-arg", "j=2"])
    assert opts.lora == ("a", "/x") and opts.extra_args == (("k", "1"), ("j", "2"))


@pytest.mark.parametrize(
    "scenario,process,noted",
    [
        ("server", "inline", True),
        ("interactive", "inline", True),
        ("offline", "inline", False),
        ("server", None, False),  # the default there: vLLM's own server process
        ("interactive", "auto", False),
        ("server", "server", False),
    ],
)
def test_only_inline_vllm_latency_runs_carry_the_in_process_note(monkeypatch, scenario, process, noted):
    from harness.notes import VLLM_LATENCY_NOTE

    forced = ["--vllm-process", process] if process else []
    cfg = _config(
        [
            "--backend",
            "vllm",
            "--scenario",
            scenario,
            "--input-file",
            "d.parquet",
            "--model-path",
            "m",
            *forced,
        ],
        monkeypatch=monkeypatch,
    )
    assert (VLLM_LATENCY_NOTE in cfg.notes) is noted
    assert cfg.backend_options.process == (process or "auto")
    assert "TPOT p99 about 2x on an H100" in VLLM_LATENCY_NOTE
    assert "leave --vllm-process at its default, server" in VLLM_LATENCY_NOTE


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

    cfg = _config(["--backend", "fake", "--input-file", "d.parquet", *extra], monkeypatch=monkeypatch)
    assert (WARMUP_NOTE in cfg.notes) is noted

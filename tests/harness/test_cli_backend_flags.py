"""The CLI's per-backend flags (each backend's own options, refused with another backend) and the
one-line errors of bad flag values."""

from __future__ import annotations

import pytest

from tests.harness.runkit import parse_cli


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
        parse_cli(argv, monkeypatch=monkeypatch)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("error: ") and err.count("\n") == 1


def test_a_flag_means_what_its_backend_says(monkeypatch):
    from gptoss.engine import EngineConfig

    vllm_cfg = parse_cli(
        ["--backend", "vllm", "--max-num-seqs", "8", "--dtype", "auto"], monkeypatch=monkeypatch
    )
    assert vllm_cfg.backend_options.engine_args == {"max_num_seqs": 8, "dtype": "auto"}  # only what was set
    gptoss_cfg = parse_cli(["--backend", "gptoss", "--max-num-seqs", "8", "--device", "cpu", "--seed", "5"])
    # EngineConfig is the gptoss options, built whole; the model path is the runner's to fill in
    assert gptoss_cfg.backend_options == EngineConfig(device="cpu", max_num_seqs=8, seed=5)
    assert parse_cli(["--backend", "gptoss"]).backend_options == EngineConfig()
    sglang = parse_cli(["--backend", "sglang", "--stream-interval", "4", "--first-token-timeout", "0"])
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
        parse_cli(argv, monkeypatch=monkeypatch)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err


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
    cfg = parse_cli(
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

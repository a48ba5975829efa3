"""gptoss.switches: a GPTOSS_* variable that no code of ours reads is refused by name, before an engine
or our vLLM MoE starts, so a misspelt or retired switch cannot time the defaults under its name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gptoss import switches, vllm_plugin
from gptoss.engine import EngineConfig, LLMEngine

PKG = Path(switches.__file__).resolve().parent


def test_names_count_inside_strings_not_comments():
    src = 'import os\n# GPTOSS_IN_A_COMMENT=1\nA = os.environ.get("GPTOSS_READ")\n"""doc: GPTOSS_DOC"""\n'
    assert switches.names_in_source(src) == {"GPTOSS_READ", "GPTOSS_DOC"}


def test_every_switch_the_package_reads_is_known_and_retired_ones_are_not():
    # a call whose first argument is a plain string naming a switch: environ.get, env_switch, _cfg_from_env...
    call = re.compile(r"""\w\(\s*["'](GPTOSS_[A-Z0-9_]+)["']""")
    read = {name for p in PKG.rglob("*.py") for name in call.findall(p.read_text())}
    assert {"GPTOSS_MOE_V3_TILES", "GPTOSS_ATTN_DECODE", "GPTOSS_V3_DEC_GATE_UP_TILES"} <= read
    assert read <= switches.known()
    # switches the results log names as removed (bench/results v40, v45): no code reads them now
    assert not {"GPTOSS_GEMV_STREAM_L2", "GPTOSS_NORM_IN_QKV"} & switches.known()


def test_unknown_names_are_refused_with_the_nearest_known_ones():
    env = {"PATH": "/bin", "GPTOSS_MOE_V3_TILES": "", "GPTOSS_MOE_V3_TILE": "gate_up@32=1", "GPTOSS_ZZZ": "1"}
    assert switches.unknown(env) == ["GPTOSS_MOE_V3_TILE", "GPTOSS_ZZZ"]
    with pytest.raises(ValueError) as e:
        switches.check_environment(env)
    assert str(e.value) == (
        "unknown gptoss switches in the environment: GPTOSS_MOE_V3_TILE (did you mean GPTOSS_MOE_V3_TILES or "
        "GPTOSS_MOE_V3_TMA?), GPTOSS_ZZZ. No code of ours reads them, so the run would time the defaults: "
        "unset them or fix their names"
    )
    switches.check_environment({"GPTOSS_PDL": "0", "HOME": "/root"})  # known ones pass


def test_the_engine_refuses_an_unknown_switch_before_loading_anything(monkeypatch, tmp_path):
    monkeypatch.setenv("GPTOSS_ATTN_DECODES", "64,2,3")
    want = r"^unknown gptoss switch in the environment: GPTOSS_ATTN_DECODES \(did you mean GPTOSS_ATTN_DECODE"
    with pytest.raises(ValueError, match=want):
        LLMEngine(EngineConfig(model_path=str(tmp_path / "no-checkpoint-here")))


def test_the_vllm_plugin_checks_only_when_on(monkeypatch):
    monkeypatch.setenv("GPTOSS_VLLM_MOE_MAX_TOKEN", "16")  # one S short
    monkeypatch.delenv(vllm_plugin.ENV, raising=False)
    vllm_plugin.register()  # off: vLLM's own MoE, nothing of ours checked or loaded
    monkeypatch.setenv(vllm_plugin.ENV, "gptoss")
    with pytest.raises(
        ValueError, match=r"GPTOSS_VLLM_MOE_MAX_TOKEN \(did you mean GPTOSS_VLLM_MOE_MAX_TOKENS"
    ):
        vllm_plugin.register()
    assert not vllm_plugin.registered_here()

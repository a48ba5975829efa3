"""make_lora sizes the deltas of the branch outputs (o_proj, the experts' down) to the base's own
scale: a calm base (make_checkpoint --init calm: o_proj at 2^-CALM_ATTN_SHIFT, the down at
2^-CALM_DOWN_SHIFT) gets each delta as much smaller, the rest of the adapter the same bits; a default
base's adapter is unchanged."""

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gptoss.checkpoint import load_config, weight_files
from gptoss.lora import WEIGHTS_FILE
from gptoss.tools.make_checkpoint import CALM_ATTN_SHIFT, CALM_DOWN_SHIFT, preset_config, write_checkpoint
from gptoss.tools.make_lora import branch_shifts, main, write_adapter


def test_a_calm_base_gets_its_branch_deltas_scaled_like_its_branches(tmp_path: Path):
    cfg = preset_config("tiny", layers=2)
    default = write_checkpoint(cfg, tmp_path / "default")
    calm = write_checkpoint(cfg, tmp_path / "calm", init="calm")
    assert branch_shifts(default, load_config(default)) == (0, 0)
    assert branch_shifts(calm, load_config(calm)) == (CALM_ATTN_SHIFT, CALM_DOWN_SHIFT)
    a = load_file(write_adapter(default, tmp_path / "a", 4, seed=3) / WEIGHTS_FILE)
    b = load_file(write_adapter(calm, tmp_path / "b", 4, seed=3) / WEIGHTS_FILE)
    assert a.keys() == b.keys()
    scaled = sorted(k for k in a if not torch.equal(a[k], b[k]))
    assert scaled == sorted(
        f"base_model.model.model.layers.{i}.{m}.lora_B.weight"
        for i in range(2)
        for m in ("self_attn.o_proj", "mlp.experts")
    )
    for k in scaled:
        shift = CALM_ATTN_SHIFT if "o_proj" in k else CALM_DOWN_SHIFT
        assert torch.equal(b[k], a[k] * 2.0**-shift)


def test_the_bf16_experts_twin_reads_the_same_shifts(tmp_path: Path):
    cfg = replace(preset_config("tiny", layers=1), quant_method=None)
    for init, want in (("default", (0, 0)), ("calm", (CALM_ATTN_SHIFT, CALM_DOWN_SHIFT))):
        base = write_checkpoint(cfg, tmp_path / init, init=init)
        assert "model.layers.0.mlp.experts.down_proj" in weight_files(base)
        assert branch_shifts(base, load_config(base)) == want


def test_delta_scales_every_b_and_alpha_moves_weight_into_the_scale(tmp_path: Path):
    # --delta is the knob of the adapter's strength: every B doubles with it, bit for bit, and each A
    # stays. --alpha is not: the scale alpha / r doubles and B halves, so B * scale is the same.
    base = write_checkpoint(preset_config("tiny", layers=1), tmp_path / "base")
    a = load_file(write_adapter(base, tmp_path / "a", 4, seed=3) / WEIGHTS_FILE)
    d = load_file(write_adapter(base, tmp_path / "d", 4, seed=3, delta=0.5) / WEIGHTS_FILE)
    s = load_file(write_adapter(base, tmp_path / "s", 4, seed=3, alpha=16) / WEIGHTS_FILE)
    assert a.keys() == d.keys() == s.keys()
    for k in a:
        if k.endswith("lora_B.weight"):
            assert torch.equal(d[k], a[k] * 2) and torch.equal(s[k], a[k] / 2), k
        else:
            assert torch.equal(d[k], a[k]) and torch.equal(s[k], a[k]), k


@pytest.mark.parametrize("delta", ["0", "-1", "nan"])
def test_a_delta_that_is_not_positive_is_refused(tmp_path: Path, capsys, delta: str):
    base = write_checkpoint(preset_config("tiny", layers=1), tmp_path / "base")
    with pytest.raises(SystemExit):
        main(["--model", str(base), "--rank", "4", "--out", str(tmp_path / "a"), "--delta", delta])
    assert f"--delta must be a positive number, got {float(delta)}" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()


def test_a_base_without_weights_is_a_clear_error(tmp_path: Path, capsys):
    base = write_checkpoint(preset_config("tiny", layers=1), tmp_path / "base")
    (base / "model.safetensors").unlink()
    with pytest.raises(SystemExit):
        main(["--model", str(base), "--rank", "4", "--out", str(tmp_path / "a")])
    assert "no model.safetensors.index.json or model.safetensors" in capsys.readouterr().err
    assert not (tmp_path / "a" / "adapter_config.json").exists()

"""bench/fault_checkpoint.py: a known-wrong copy of a checkpoint for the agreement rows' calibration.
Only the matched tensors change, by exactly the edit; everything else is the source's bytes."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from bench.fault_checkpoint import main, write_faulty
from gptoss.checkpoint import load
from gptoss.config import PRESETS
from gptoss.tools.make_checkpoint import write_checkpoint

MICRO = replace(PRESETS["tiny"], vocab_size=256).with_layers(2)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    return write_checkpoint(MICRO, tmp_path_factory.mktemp("src") / "ck", layers_per_shard=1)


def _all(path: Path) -> dict[str, torch.Tensor]:
    index = json.loads((path / "model.safetensors.index.json").read_text())
    return {k: v for f in sorted(set(index["weight_map"].values())) for k, v in load_file(path / f).items()}


def test_edits_change_only_the_matched_tensors(sharded: Path, tmp_path: Path, capsys):
    dst = tmp_path / "bad"
    argv = [str(sharded), str(dst), "--edit", r"self_attn\.sinks$", "set=-inf"]
    argv += ["--edit", r"layers\.1\.mlp\.experts\.down_proj_scales$", "add=1"]
    assert main(argv) == 0
    assert "'self_attn\\\\.sinks$': 2 tensors changed" in capsys.readouterr().out
    src, bad = _all(sharded), _all(dst)
    assert src.keys() == bad.keys()
    changed = sorted(k for k in src if not torch.equal(src[k], bad[k]))
    assert changed == [
        "model.layers.0.self_attn.sinks",
        "model.layers.1.mlp.experts.down_proj_scales",
        "model.layers.1.self_attn.sinks",
    ]
    assert torch.isneginf(bad["model.layers.0.self_attn.sinks"].float()).all()
    scales = "model.layers.1.mlp.experts.down_proj_scales"
    assert torch.equal(bad[scales].int(), src[scales].int() + 1)
    # The shard with no edit is the source's file (a hard link), and the copy loads as a checkpoint.
    assert (dst / "model-00000-of-00002.safetensors").stat().st_ino == (
        sharded / "model-00000-of-00002.safetensors"
    ).stat().st_ino
    cfg, _ = load(dst, dtype=torch.float32)
    assert cfg == MICRO


def test_a_pattern_that_matches_nothing_is_an_error_and_leaves_nothing(sharded: Path, tmp_path: Path):
    with pytest.raises(ValueError, match=r"no tensor matches 'mlp\\\\.gate\$'"):
        write_faulty(sharded, tmp_path / "x", [(r"mlp\.gate$", "set", 0.0)])
    assert not (tmp_path / "x").exists()


def test_uint8_leaving_its_range_is_refused(sharded: Path, tmp_path: Path):
    with pytest.raises(ValueError, match="add 300.0 takes a uint8 tensor outside 0..255"):
        write_faulty(sharded, tmp_path / "y", [(r"down_proj_scales$", "add", 300.0)])


def test_an_existing_checkpoint_is_not_overwritten(sharded: Path):
    with pytest.raises(FileExistsError, match="already holds a checkpoint"):
        write_faulty(sharded, sharded, [(r"sinks$", "set", 0.0)])


def test_unknown_op_is_refused(sharded: Path, tmp_path: Path, capsys):
    with pytest.raises(SystemExit):
        main([str(sharded), str(tmp_path / "z"), "--edit", "sinks", "negate=1"])
    assert "OP must be one of ('set', 'add', 'mul'), got 'negate'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(sharded), str(tmp_path / "z"), "--edit", "sinks", "add=two"])
    assert "'add=two' is not OP=NUMBER" in capsys.readouterr().err

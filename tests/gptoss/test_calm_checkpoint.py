"""make_checkpoint --init calm: the same shapes and draw as the default, with the branch outputs
scaled down, the sinks raised, expert keys in the embedding and the routers, and a next token planted
in each embedding row (see make_checkpoint.INITS)."""

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gptoss import mxfp4
from gptoss.checkpoint import TensorSpec, load
from gptoss.config import PRESETS
from gptoss.tools.make_checkpoint import (
    CALM_ATTN_SHIFT,
    CALM_DOWN_SHIFT,
    CALM_PLANT,
    CALM_ROUTE,
    CALM_SINK,
    calm_expert_keys,
    calm_expert_sets,
    calm_next_tokens,
    calm_router_order,
    draw_shift,
    main,
    preset_config,
    random_tensor,
    write_checkpoint,
)

MICRO = replace(PRESETS["tiny"], vocab_size=256).with_layers(2)
CALM_NAMES = ("self_attn.o_proj.weight", "self_attn.o_proj.bias", "down_proj_scales", "down_proj_bias")


@pytest.fixture(scope="module")
def draws(tmp_path_factory) -> tuple[dict, dict]:
    root = tmp_path_factory.mktemp("calm")
    default = load_file(write_checkpoint(MICRO, root / "default") / "model.safetensors")
    calm = load_file(write_checkpoint(MICRO, root / "calm", init="calm") / "model.safetensors")
    return default, calm


def test_calm_changes_only_the_branch_outputs_and_the_embedding(draws):
    default, calm = draws
    assert default.keys() == calm.keys()
    changed = sorted(k for k in default if not torch.equal(default[k], calm[k]))
    expected = ["model.embed_tokens.weight"] + [
        f"model.layers.{i}.{part}{name}"
        for i in range(2)
        for part, name in [("", CALM_NAMES[0]), ("", CALM_NAMES[1])]
        + [("mlp.experts.", CALM_NAMES[2]), ("mlp.experts.", CALM_NAMES[3]), ("mlp.", "router.weight")]
        + [("self_attn.", "sinks")]
    ]
    assert changed == sorted(expected)
    for i in range(2):
        o = f"model.layers.{i}.self_attn.o_proj."
        down = f"model.layers.{i}.mlp.experts.down_proj_"
        # Powers of two: exact in bf16 and in the e8m0 exponent byte.
        assert torch.equal(calm[o + "weight"], default[o + "weight"] * 2.0**-CALM_ATTN_SHIFT)
        assert torch.equal(calm[o + "bias"], default[o + "bias"] * 2.0**-CALM_ATTN_SHIFT)
        assert torch.equal(calm[down + "bias"], default[down + "bias"] * 2.0**-CALM_DOWN_SHIFT)
        assert torch.equal(calm[down + "scales"].int(), default[down + "scales"].int() - CALM_DOWN_SHIFT)
        assert torch.equal(calm[down + "blocks"], default[down + "blocks"])
        sinks = f"model.layers.{i}.self_attn.sinks"
        assert torch.equal(calm[sinks], default[sinks] + CALM_SINK)
        # What make_lora reads back to size an adapter's deltas.
        assert draw_shift(o + "weight", calm[o + "weight"], MICRO) == CALM_ATTN_SHIFT
        assert draw_shift(down + "scales", calm[down + "scales"], MICRO) == CALM_DOWN_SHIFT
        assert draw_shift(o + "weight", default[o + "weight"], MICRO) == 0
        assert draw_shift(down + "scales", default[down + "scales"], MICRO) == 0


def test_calm_embedding_is_the_default_row_plus_the_planted_directions(draws):
    default, calm = draws
    head = default["lm_head.weight"].float()
    plant = head[calm_next_tokens(MICRO.vocab_size, 0, "cpu")]
    plant *= math.sqrt(MICRO.hidden_size) / plant.norm(dim=-1, keepdim=True)
    keys = calm_expert_keys(MICRO, 0, "cpu")
    sets = calm_expert_sets(MICRO, 0, "cpu")
    assert sets.shape == (MICRO.vocab_size, MICRO.num_experts_per_tok)
    assert all(len(set(row)) == MICRO.num_experts_per_tok for row in sets.tolist())
    want = default["model.embed_tokens.weight"].float() + CALM_PLANT * plant + CALM_ROUTE * keys[sets].sum(1)
    torch.testing.assert_close(calm["model.embed_tokens.weight"].float(), want, atol=0.02, rtol=0.01)


def test_calm_router_rows_are_the_expert_keys_in_the_layers_order(draws):
    _, calm = draws
    keys = calm_expert_keys(MICRO, 0, "cpu")
    orders = []
    for i in range(2):
        name = f"model.layers.{i}.mlp.router.weight"
        order = calm_router_order(name, MICRO, 0, "cpu")
        want = (keys[order] / math.sqrt(MICRO.hidden_size)).to(torch.bfloat16)
        assert torch.equal(calm[name], want)
        orders.append(order.tolist())
    assert orders[0] != orders[1]  # each layer routes a token to other experts


def test_at_full_width_the_planted_token_and_experts_lead_clearly():
    """At gpt-oss's width (2880) a bare calm embedding's logits peak at next(t), and its router logits'
    top-k is the layer's image of S(t) with a margin no rounding flips. The default draw peaks at
    next(t) by chance (1 / vocab)."""
    cfg = replace(PRESETS["20b"], vocab_size=2048)
    spec = TensorSpec((cfg.vocab_size, cfg.hidden_size))
    head = random_tensor("lm_head.weight", spec, cfg, 0, "cpu").float()
    nxt = calm_next_tokens(cfg.vocab_size, 0, "cpu")
    embed = {}
    for init, lo, hi in (("calm", 0.98, 1.0), ("default", 0.0, 0.01)):
        embed[init] = random_tensor("model.embed_tokens.weight", spec, cfg, 0, "cpu", init).float()
        won = float((embed[init] @ head.t()).argmax(-1).eq(nxt).float().mean())
        assert lo <= won <= hi, (init, won)
    name = "model.layers.5.mlp.router.weight"
    router = random_tensor(name, TensorSpec((cfg.num_local_experts, cfg.hidden_size)), cfg, 0, "cpu", "calm")
    x = (
        embed["calm"] / embed["calm"].pow(2).mean(-1, keepdim=True).sqrt()
    )  # the router sees the RMS-normed row
    logits = x @ router.float().t()
    top = logits.topk(cfg.num_experts_per_tok + 1, -1)
    order = calm_router_order(name, cfg, 0, "cpu")
    chosen = order[top.indices[:, : cfg.num_experts_per_tok]].sort(-1).values
    planned = chosen.eq(calm_expert_sets(cfg, 0, "cpu").sort(-1).values).all(-1).float().mean()
    assert float(planned) > 0.98  # the rest: a key weaker than a random direction, by chance
    gap = top.values[:, -2] - top.values[:, -1]  # k-th against (k+1)-th, in router-logit stds (~1)
    p5, p50 = torch.quantile(gap, torch.tensor([0.05, 0.5])).tolist()
    assert p5 > 0.5 and p50 > 2.0


def test_next_tokens_are_a_seeded_permutation():
    a, b = calm_next_tokens(512, 0, "cpu"), calm_next_tokens(512, 1, "cpu")
    assert torch.equal(a.sort().values, torch.arange(512))
    assert torch.equal(a, calm_next_tokens(512, 0, "cpu"))
    assert not torch.equal(a, b)


def test_calm_bf16_experts_twin_holds_the_dequantized_calm_draw(tmp_path: Path):
    packed = load_file(write_checkpoint(MICRO, tmp_path / "p", init="calm") / "model.safetensors")
    dense_cfg = replace(MICRO, quant_method=None)
    dense = load_file(write_checkpoint(dense_cfg, tmp_path / "d", init="calm") / "model.safetensors")
    x = "model.layers.1.mlp.experts.down_proj"
    want = torch.stack(
        [
            mxfp4.dequantize(b, s, torch.bfloat16).t()
            for b, s in zip(packed[x + "_blocks"], packed[x + "_scales"], strict=True)
        ]
    )
    assert torch.equal(dense[x], want)


def test_unknown_init_is_refused():
    spec = TensorSpec((4, 4))
    with pytest.raises(ValueError, match=r"init must be one of \('default', 'calm'\), got 'quiet'"):
        random_tensor("model.norm.weight", spec, MICRO, 0, "cpu", "quiet")


def test_cli_writes_a_calm_checkpoint(tmp_path: Path, capsys):
    assert main(["--preset", "tiny", "--layers", "1", "--out", str(tmp_path / "c"), "--init", "calm"]) == 0
    cfg, w = load(tmp_path / "c", dtype=torch.float32)
    assert cfg == preset_config("tiny", 1)
    default = write_checkpoint(preset_config("tiny", 1), tmp_path / "d")
    _, d = load(default, dtype=torch.float32)
    o = "model.layers.0.self_attn.o_proj.weight"
    assert torch.equal(w[o], d[o] * 2.0**-CALM_ATTN_SHIFT)
    with pytest.raises(SystemExit):
        main(["--preset", "tiny", "--out", str(tmp_path / "x"), "--init", "loud"])
    assert "invalid choice: 'loud'" in capsys.readouterr().err

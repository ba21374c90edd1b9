"""config.json parsing per family, with byte counts worked out by hand."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from agentbatch.planning.model_shape import ConfigError, shape_from_config


def preset(name: str) -> dict:
    text = resources.files("agentbatch.planning.model_configs").joinpath(f"{name}.json").read_text()
    return {k: v for k, v in json.loads(text).items() if not k.startswith("_")}


def test_llama3_8b_preset() -> None:
    s = shape_from_config(preset("llama-3-8b"))
    assert s.family == "dense" and not s.is_hybrid
    assert s.attention_layers == 32
    # 32 layers x 2 (K,V) x 8 KV heads x 128 head_dim x 2 B (bf16) = 128 KiB per token
    assert s.kv_bytes_per_token == 32 * 2 * 8 * 128 * 2 == 131072
    assert s.state_bytes_per_seq == 0
    # Meta's figure: 8.03 B parameters
    assert s.total_params == pytest.approx(8.03e9, rel=0.005)
    assert s.weights_bytes == int(s.total_params * 2)
    assert s.max_context == 8192


def test_ring_flash_linear_preset() -> None:
    s = shape_from_config(preset("ring-flash-linear-2.0"))
    assert s.family == "bailing_linear" and s.is_hybrid
    assert (s.attention_layers, s.state_layer_count) == (4, 28)  # 1 softmax layer in 8
    assert s.kv_bytes_per_token == 4 * 2 * 4 * 128 * 2 == 8192
    (g,) = s.state_layers
    assert g.kind == "linear_attention" and g.bytes_per_layer == 32 * 128 * 128 * 4  # fp32 state
    assert s.state_bytes_per_seq == 28 * 2 * 2**20
    assert s.token_equiv == 7168
    assert s.total_params == pytest.approx(104e9, rel=0.01)  # the model card's 104B
    assert s.weights_bytes == int(s.total_params)  # FP8 weights: 1 byte per parameter
    assert s.state_dtype == "float32"


def test_ring_mini_linear_group_of_five() -> None:
    cfg = {
        "model_type": "bailing_moe_linear",
        "num_hidden_layers": 20,
        "layer_group_size": 5,
        "hidden_size": 2048,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "torch_dtype": "bfloat16",
    }
    s = shape_from_config(cfg)
    assert (s.attention_layers, s.state_layer_count) == (4, 16)


def test_trailing_incomplete_group_is_attention() -> None:
    # 10 layers, groups of 4: layers 3 and 7 close a group, 8 and 9 form an incomplete group -> attention
    cfg = {
        "model_type": "bailing_moe_linear",
        "num_hidden_layers": 10,
        "layer_group_size": 4,
        "hidden_size": 64,
        "num_attention_heads": 4,
    }
    s = shape_from_config(cfg)
    assert (s.attention_layers, s.state_layer_count) == (4, 6)


QWEN3_NEXT = {
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "num_hidden_layers": 48,
    "full_attention_interval": 4,
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "vocab_size": 151936,
    "num_experts": 512,
    "num_experts_per_tok": 10,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "intermediate_size": 5120,
    "torch_dtype": "bfloat16",
    "max_position_embeddings": 262144,
}


def test_qwen3_next_interval() -> None:
    s = shape_from_config(QWEN3_NEXT)
    assert (s.attention_layers, s.state_layer_count) == (12, 36)
    assert s.kv_bytes_per_token_layer == 2 * 2 * 256 * 2 == 2048
    (g,) = s.state_layers
    assert g.kind == "gated_deltanet"
    assert g.ssm_bytes == 32 * 128 * 128 * 2  # v_heads x dk x dv x bf16
    assert g.conv_bytes == (4 - 1) * (2 * 16 * 128 + 32 * 128) * 2
    assert s.total_params == pytest.approx(80e9, rel=0.03)  # Qwen3-Next-80B-A3B
    assert s.active_params == pytest.approx(3e9, rel=0.2)


def test_qwen3_next_layer_types_wins_over_interval() -> None:
    cfg = dict(QWEN3_NEXT, num_hidden_layers=4, layer_types=["linear_attention", "full_attention"] * 2)
    s = shape_from_config(cfg)
    assert (s.attention_layers, s.state_layer_count) == (2, 2)


def test_nemotron_h_pattern() -> None:
    cfg = {
        "model_type": "nemotron_h",
        "hybrid_override_pattern": "M-M*-M-",
        "num_hidden_layers": 7,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "mamba_num_heads": 8,
        "mamba_head_dim": 16,
        "ssm_state_size": 32,
        "n_groups": 2,
        "conv_kernel": 4,
        "intermediate_size": 256,
        "torch_dtype": "bfloat16",
    }
    s = shape_from_config(cfg)
    assert (s.attention_layers, s.state_layer_count) == (1, 3)
    (g,) = s.state_layers
    assert g.ssm_bytes == 8 * 16 * 32 * 2
    assert g.conv_bytes == 3 * (8 * 16 + 2 * 2 * 32) * 2


def test_mamba2_pure() -> None:
    cfg = {
        "model_type": "mamba2",
        "num_hidden_layers": 4,
        "hidden_size": 128,
        "expand": 2,
        "state_size": 16,
        "n_groups": 1,
        "conv_kernel": 4,
        "head_dim": 64,
        "num_heads": 4,
        "vocab_size": 1000,
        "torch_dtype": "float32",
    }
    s = shape_from_config(cfg)
    assert s.attention_layers == 0 and s.state_layer_count == 4
    assert s.state_layers[0].ssm_bytes == 4 * 64 * 16 * 4
    assert s.state_layers[0].conv_bytes == 3 * (256 + 2 * 16) * 4


def test_jamba_period_offset() -> None:
    cfg = {
        "model_type": "jamba",
        "num_hidden_layers": 32,
        "attn_layer_period": 8,
        "attn_layer_offset": 4,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "torch_dtype": "bfloat16",
    }
    s = shape_from_config(cfg)
    assert (s.attention_layers, s.state_layer_count) == (4, 28)
    g = s.state_layers[0]
    assert (g.kind, g.ssm_bytes, g.conv_bytes) == ("mamba1", 8192 * 16 * 2, 3 * 8192 * 2)


def test_layers_block_type_hybrid() -> None:
    cfg = {
        "model_type": "zamba2",
        "num_hidden_layers": 4,
        "layers_block_type": ["mamba", "mamba", "hybrid", "mamba"],
        "hidden_size": 64,
        "num_attention_heads": 4,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_headdim": 16,
        "mamba_ngroups": 1,
    }
    s = shape_from_config(cfg)
    # "hybrid" blocks hold a mamba layer and a (shared) attention layer
    assert (s.attention_layers, s.state_layer_count) == (1, 4)


def test_lfm2_layer_types() -> None:
    cfg = {
        "model_type": "lfm2",
        "num_hidden_layers": 4,
        "layer_types": ["conv", "conv", "full_attention", "conv"],
        "hidden_size": 1024,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "conv_L_cache": 3,
    }
    s = shape_from_config(cfg)
    assert (s.attention_layers, s.state_layer_count) == (1, 3)
    assert s.state_layers[0].conv_bytes == (3 - 1) * 1024 * 2  # conv_dim defaults to hidden_size


def test_mla_kv_bytes() -> None:
    cfg = {
        "model_type": "deepseek_v3",
        "num_hidden_layers": 2,
        "hidden_size": 1024,
        "num_attention_heads": 8,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "torch_dtype": "bfloat16",
    }
    assert shape_from_config(cfg).kv_bytes_per_token == 2 * (512 + 64) * 2


def test_kv_cache_dtype_override() -> None:
    assert shape_from_config(preset("llama-3-8b"), kv_cache_dtype="fp8").kv_bytes_per_token == 65536


@pytest.mark.parametrize(
    ("cfg", "field", "words"),
    [
        (
            {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4},
            "num_hidden_layers",
            "missing",
        ),
        (
            {"model_type": "llama", "num_hidden_layers": "two", "hidden_size": 64, "num_attention_heads": 4},
            "num_hidden_layers",
            "integer",
        ),
        (
            {
                "model_type": "llama",
                "num_hidden_layers": 2,
                "hidden_size": 64,
                "num_attention_heads": 4,
                "torch_dtype": "float13",
            },
            "torch_dtype",
            "unknown dtype",
        ),
        (
            {"model_type": "qwen3_next", "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4},
            "full_attention_interval",
            "missing",
        ),
        (
            {
                "model_type": "qwen3_next",
                "num_hidden_layers": 3,
                "layer_types": ["full_attention"],
                "hidden_size": 64,
                "num_attention_heads": 4,
            },
            "layer_types",
            "3",
        ),
        (
            {
                "model_type": "lfm2",
                "num_hidden_layers": 1,
                "layer_types": ["sliding_attention"],
                "hidden_size": 64,
                "num_attention_heads": 4,
            },
            "layer_types",
            "sliding_attention",
        ),
        (
            {
                "model_type": "nemotron_h",
                "hybrid_override_pattern": "M*X",
                "hidden_size": 64,
                "num_attention_heads": 4,
            },
            "hybrid_override_pattern",
            "'X'",
        ),
        ({"model_type": "mystery", "num_hidden_layers": 2}, "model_type", "family"),
        (
            {
                "model_type": "qwen3_next",
                "num_hidden_layers": 4,
                "full_attention_interval": 2,
                "hidden_size": 64,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
            },
            "linear_num_key_heads",
            "missing",
        ),
    ],
)
def test_errors_name_the_field(cfg: dict, field: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        shape_from_config(cfg, source="my/config.json")
    assert info.value.field == field
    assert "my/config.json" in str(info.value) and words in str(info.value)

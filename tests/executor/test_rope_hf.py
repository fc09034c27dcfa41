"""The executor's RoPE tables equal transformers' LlamaRotaryEmbedding, scaled or not."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from executor.model.llama import rope_tables
from planner.hf_config import model_from_hf_config

transformers = pytest.importorskip("transformers")
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402

ROPES = [
    {"rope_type": "default", "rope_theta": 500000.0},
    {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    # original context 32 puts the 64 frequencies of head_dim 128 in all three llama3 bands
    {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
     "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
]


@pytest.mark.parametrize("rope", ROPES, ids=[r["rope_type"] for r in ROPES])
def test_rope_tables_match_transformers(rope: dict[str, Any]) -> None:
    config = transformers.LlamaConfig(hidden_size=512, num_attention_heads=4, num_key_value_heads=4,
                                      intermediate_size=64, num_hidden_layers=1, vocab_size=16,
                                      max_position_embeddings=256, rope_parameters=rope)
    m = model_from_hf_config(config.to_dict())
    assert (m.rope_scaling.rope_type if m.rope_scaling else "default") == rope["rope_type"]
    cos, sin = rope_tables(m.seq_len, m.head_dim, m.rope_theta, scaling=m.rope_scaling)
    ref_cos, ref_sin = LlamaRotaryEmbedding(config)(torch.zeros(1, dtype=torch.float32),
                                                     torch.arange(m.seq_len)[None])
    # transformers computes the angles in fp32, we in fp64: fp32 rounding of angles up to ~256 rad
    torch.testing.assert_close(cos, ref_cos[0], atol=1e-4, rtol=0)
    torch.testing.assert_close(sin, ref_sin[0], atol=1e-4, rtol=0)
    if rope["rope_type"] != "default":  # the scaling changed something
        plain, _ = rope_tables(m.seq_len, m.head_dim, m.rope_theta)
        assert (plain - cos).abs().max() > 0.1

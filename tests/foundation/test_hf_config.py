"""Reading Hugging Face Llama configs: every field the executor honours, a clear refusal of the rest."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from planner.errors import SpecError
from planner.hf_config import hf_config_of, model_from_hf_config, resolve_model
from planner.model import PRESETS, model_from_dict
from planner.plan import plan_from_dict, plan_to_dict
from planner.rope import RopeScaling, inv_frequencies

BASE: dict[str, Any] = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 176,
                        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
                        "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "hidden_act": "silu",
                        "attention_bias": False, "mlp_bias": False, "head_dim": 16, "tie_word_embeddings": False}
LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def cfg(**changes: Any) -> dict[str, Any]:
    out = {**BASE, **changes}
    return {k: v for k, v in out.items() if v is not ...}


def test_rope_theta_of_transformers_5() -> None:
    """transformers 5.x keeps θ under rope_parameters: a Llama-3 config must not fall back to 10000."""
    m = model_from_hf_config(cfg(rope_parameters={"rope_type": "default", "rope_theta": 500000.0}))
    assert m.rope_theta == 500000.0 and m.rope_scaling is None
    assert model_from_hf_config(cfg(rope_theta=250000.0)).rope_theta == 250000.0  # legacy
    assert model_from_hf_config(cfg()).rope_theta == 10000.0  # LlamaConfig's default


def test_llama3_scaling_both_spellings() -> None:
    new = model_from_hf_config(cfg(rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, **LLAMA3}))
    old = model_from_hf_config(cfg(rope_theta=500000.0, rope_scaling={"type": "llama3", **LLAMA3}))
    assert new == old
    assert new.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)
    lin = model_from_hf_config(cfg(rope_scaling={"rope_type": "linear", "factor": 2.0}))
    assert lin.rope_scaling == RopeScaling("linear", 2.0)
    assert inv_frequencies(16, 10000.0, lin.rope_scaling) == [f / 2 for f in inv_frequencies(16, 10000.0)]


@pytest.mark.parametrize("changes, field", [
    ({"attention_bias": True}, "config.attention_bias"),
    ({"mlp_bias": True}, "config.mlp_bias"),
    ({"hidden_act": "gelu"}, "config.hidden_act"),
    ({"attention_dropout": 0.1}, "config.attention_dropout"),
    ({"head_dim": 32}, "config.head_dim"),
    ({"model_type": "qwen2"}, "config.model_type"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "config.rope_scaling.rope_type"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "config.rope_parameters.rope_type"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "config.rope_scaling.low_freq_factor"),
])
def test_refuses_what_the_executor_cannot_honour(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as info:
        model_from_hf_config(cfg(**changes))
    assert info.value.path == field and "\n" not in str(info.value)


def test_defaults_follow_llama_config() -> None:
    m = model_from_hf_config(cfg(rms_norm_eps=..., max_position_embeddings=..., num_key_value_heads=None,
                                 head_dim=None))
    assert (m.norm_eps, m.seq_len, m.num_kv_heads) == (1e-6, 2048, 4)
    assert model_from_hf_config(cfg(tie_word_embeddings=True)).tie_embeddings  # the executor refuses it later


def test_identity_does_not_depend_on_the_folder(tmp_path: Path) -> None:
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "config.json").write_text(json.dumps(cfg()))
    a = resolve_model(str(tmp_path / "a" / "config.json"))
    b = resolve_model(str(tmp_path / "b"))  # a model folder works too
    assert a == b and a.name == "llama-L2-H64"
    assert replace(a, name="other", seq_len=8).weights_identity() == a.weights_identity()
    assert replace(a, rope_theta=1.0).weights_identity() != a.weights_identity()


def test_plan_and_export_keep_the_scaling() -> None:
    m = model_from_hf_config(cfg(rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, **LLAMA3}))
    assert model_from_dict(m.to_dict()) == m
    assert "rope_scaling" not in PRESETS["tiny"].to_dict()  # unscaled plan files are unchanged
    plan = {"format": "hexiscale.plan/1", "model": m.to_dict(), "global_batch_size": 2,
            "pipelines": [{"batch_size": 2, "micro_batches": 1, "stages": [{"devices": ["n:0"], "tp": 1,
                                                                           "layers": [0, 2]}]}]}
    assert plan_from_dict(plan_to_dict(plan_from_dict(plan))).model == m
    assert model_from_hf_config(hf_config_of(m)) == m
    with pytest.raises(SpecError, match="rope_scaling.extra"):
        model_from_dict({**m.to_dict(), "rope_scaling": {**m.to_dict()["rope_scaling"], "extra": 1}})

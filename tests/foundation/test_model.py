from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.errors import SpecError
from planner.hf_config import model_from_hf_config, resolve_model
from planner.model import PRESETS, ModelSpec, model_from_dict


@pytest.mark.parametrize("name, params", [
    ("llama2-7b", 6_738_415_616),    # Hugging Face meta-llama/Llama-2-7b-hf
    ("llama2-13b", 13_015_864_320),
    ("llama2-70b", 68_976_648_192),
    ("llama3-8b", 8_030_261_248),
])
def test_param_counts_match_published(name: str, params: int) -> None:
    assert PRESETS[name].param_count() == params


def test_presets_exist() -> None:
    for name in ("llama2-7b", "llama2-13b", "llama-30b", "llama2-70b", "llama3-8b", "tiny"):
        assert name in PRESETS


def test_flops_hand_computed() -> None:
    m = ModelSpec("t", num_layers=2, hidden_size=8, ffn_hidden_size=16, num_heads=2, num_kv_heads=1,
                  vocab_size=10, seq_len=4)
    # per layer: q 64 + k 32 + v 32 + o 64 + mlp 3*8*16=384 + norms 16 = 592
    assert m.layer_params() == 592
    n = 2 * 592 + 10 * 8 + 8  # layers + lm head + final norm (embedding excluded)
    assert m.matmul_params() == n
    attn = 4 * 2 * 8 * 4
    assert m.model_flops_per_token() == 6 * n + 3 * attn
    assert m.hardware_flops_per_token("none") == m.model_flops_per_token()
    assert m.hardware_flops_per_token("selective") == 6 * n + 4 * attn
    assert m.hardware_flops_per_token("full") == 8 * n + 4 * attn
    assert m.param_count() == 2 * 592 + 80 + 80 + 8
    tied = ModelSpec("t", 2, 8, 16, 2, 1, 10, 4, tie_embeddings=True)
    assert tied.param_count() == m.param_count() - 80


def test_invalid_model() -> None:
    with pytest.raises(SpecError, match="num_heads"):
        ModelSpec("x", 2, 10, 16, 3, 1, 10, 4)
    with pytest.raises(SpecError, match="num_kv_heads"):
        ModelSpec("x", 2, 12, 16, 4, 3, 10, 4)
    with pytest.raises(SpecError) as info:
        model_from_dict({"num_layers": 2, "hidden_size": 8}, "model")
    assert info.value.path.startswith("model.")


def test_hf_config(tmp_path: Path) -> None:
    cfg = {"num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
           "num_key_value_heads": 8, "vocab_size": 128256, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
           "max_position_embeddings": 8192, "tie_word_embeddings": False}
    m = model_from_hf_config(cfg)
    assert m.param_count() == PRESETS["llama3-8b"].param_count()
    path = tmp_path / "cfg" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    assert resolve_model(str(path), seq_len=2048).seq_len == 2048
    with pytest.raises(SpecError, match="neither a preset"):
        resolve_model("no-such-model")
    with pytest.raises(SpecError, match="missing"):
        model_from_hf_config({"hidden_size": 3})

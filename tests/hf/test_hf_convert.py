"""Hugging Face Llama folders in and out: a tiny model built from a config (GQA, llama3 RoPE
scaling, sharded safetensors) is imported, gives transformers' logits, and exports bit-exactly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from executor.model.llama import StageModule
from executor.state.checkpoint import read_logical
from executor.state.hf_convert import export_hf, import_hf
from hexiscale.cli.main import main
from planner.errors import SpecError
from planner.layout import logical_params
from planner.model import ModelSpec

transformers = pytest.importorskip("transformers")

ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 16}


def tiny_hf(folder: Path, **changes: Any) -> Any:
    """A random tiny LlamaForCausalLM saved as 100 KB safetensors shards with an index."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**{
        "vocab_size": 256, "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 32, "rms_norm_eps": 1e-5,
        "rope_parameters": ROPE, "tie_word_embeddings": False, **changes})
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(folder, max_shard_size="100KB")
    return model


def our_logits(model: ModelSpec, weights: dict[str, torch.Tensor], ids: torch.Tensor) -> torch.Tensor:
    """The executor's own stage module holding the whole model (one rank, TP 1)."""
    stage = StageModule(model, layers=(0, model.num_layers), first=True, last=True, tp=1, tp_rank=0, group=None)
    stage.load_logical(weights, {p.name: p.shard_dim for p in logical_params(model)})
    with torch.no_grad():
        assert stage.final_norm is not None and stage.lm_head is not None
        return stage.lm_head(stage.final_norm(stage(ids)))


def hf_logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


def test_import_gives_transformers_logits_and_export_is_exact(tmp_path: Path) -> None:
    hf = tiny_hf(tmp_path / "hf")
    assert len(list((tmp_path / "hf").glob("model-*.safetensors"))) > 1  # really sharded
    model = import_hf(tmp_path / "hf", tmp_path / "ck")
    assert model.rope_scaling is not None and model.num_kv_heads == 2
    got_model, stream = read_logical(tmp_path / "ck")
    weights = dict(stream)
    assert got_model == model
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(our_logits(model, weights, ids), hf_logits(hf, ids), rtol=1e-5, atol=1e-5)
    files = export_hf(tmp_path / "ck", tmp_path / "out", max_shard_bytes=60_000)
    assert (tmp_path / "out" / "model.safetensors.index.json") in files
    back = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "out").eval()
    for name, value in hf.state_dict().items():
        assert torch.equal(back.state_dict()[name], value), name  # bit-exact round trip
    assert torch.equal(hf_logits(back, ids), hf_logits(hf, ids))
    from safetensors import safe_open  # our writer's files read by the reference implementation

    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    for file in sorted(set(index["weight_map"].values())):
        with safe_open(str(tmp_path / "out" / file), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open has keys(), no iteration
                assert torch.equal(f.get_tensor(key), hf.state_dict()[key])


def test_bf16_weights_and_export_dtype(tmp_path: Path) -> None:
    hf = tiny_hf(tmp_path / "hf", dtype=torch.bfloat16).to(torch.bfloat16)
    hf.save_pretrained(tmp_path / "hf", max_shard_size="100KB")
    import_hf(tmp_path / "hf", tmp_path / "ck")
    _, stream = read_logical(tmp_path / "ck")
    weights = dict(stream)
    assert weights["embed.weight"].dtype == torch.float32
    assert torch.equal(weights["embed.weight"], hf.state_dict()["model.embed_tokens.weight"].float())
    assert main(["hf", "export", str(tmp_path / "ck"), "-o", str(tmp_path / "out"), "--dtype", "bf16"]) == 0
    back = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "out")
    assert back.config.dtype == torch.bfloat16 or back.dtype == torch.bfloat16
    assert torch.equal(back.state_dict()["lm_head.weight"].to(torch.bfloat16), hf.state_dict()["lm_head.weight"])


def test_import_refuses_what_it_cannot_hold(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tiny_hf(tmp_path / "tied", tie_word_embeddings=True)
    with pytest.raises(SpecError, match="tie_word_embeddings"):
        import_hf(tmp_path / "tied", tmp_path / "ck")
    tiny_hf(tmp_path / "bias", attention_bias=True)
    with pytest.raises(SpecError, match="config.attention_bias"):
        import_hf(tmp_path / "bias", tmp_path / "ck")
    assert main(["hf", "import", str(tmp_path / "nothing"), "-o", str(tmp_path / "ck")]) == 1
    assert "not a model folder" in capsys.readouterr().err

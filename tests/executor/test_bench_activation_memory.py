"""``benchmarks/executor/activation_memory.py --cpu-smoke`` (the GPU program's path on CPU: eager
blocks, bytes counted by saved-tensor hooks; the table, the fit and the JSON) and the saved-tensor
recorder it counts with. On CPU the eager layer saves exactly what the planner's formula counts,
in fp32 and under bf16 autocast, weight copies included: these tests pin that."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.executor.activation_memory import main, planner_params, predicted
from benchmarks.executor.saved_tensors import breakdown, bytes_by_kind, forward_by_layer, record_saved
from executor.model.llama import StageModule
from executor.profiler.compute import prepare
from planner.model import PRESETS


def test_smoke_measures_every_micro_batch(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["--cpu-smoke", "--out", str(tmp_path)]) == 0
    [path] = tmp_path.glob("activation_memory_cpu_smoke_*.json")
    res = json.loads(path.read_text())
    assert res["date"] and res["torch"] and res["device"] == "cpu" and res["model"]["name"] == "tiny"
    assert [(r["mode"], r["method"], r["micro_batch"]) for r in res["rows"]] == [
        ("eager", "saved-hooks", 1), ("eager", "saved-hooks", 2)]
    for r in res["rows"]:
        assert r["per_layer_each"][0] == r["per_layer_each"][1] == r["per_layer"]  # every layer alike
        assert r["ratio"] == pytest.approx(1.0, rel=1e-9), "fp32 eager on CPU saves what layer_activation_bytes counts"
    [fit] = res["fits"]
    assert fit["per_sample_ratio"] == pytest.approx(1.0) and fit["num_layers"] == 4
    entries = res["breakdowns"]["eager"]["entries"]
    assert sum(e["bytes"] for e in entries) == res["rows"][0]["per_layer"]
    assert any(e["saved_by"] == "scaled_dot_product_attention" for e in entries)
    out = capsys.readouterr().out
    assert "| eager | saved-hooks | 2 |" in out and "per sample x num_layers" in out
    assert "what eager layer 0 saves" in out


def test_bf16_autocast_weight_copies_are_counted_apart() -> None:
    """The GPU path's numerics on CPU autocast: compute-dtype weight copies are told from
    activations by value, even where an activation has a weight's shape (b·s == kv_dim here)."""
    model = PRESETS["tiny"]  # seq 32, kv_dim 32: a [32, 64] activation has wk's shape
    stage = prepare(StageModule(model, layers=(0, 2), first=False, last=False, tp=1, tp_rank=0, group=None),
                    "fp32", torch.device("cpu"))
    x = torch.randn(1, model.seq_len, model.hidden_size, requires_grad=True)
    with record_saved(stage) as rec, torch.autocast("cpu", dtype=torch.bfloat16):
        y = forward_by_layer(stage, x, rec)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.testing.assert_close(y, stage(x), rtol=0, atol=0)  # the stage's own forward, the same kernels
    saved = rec.saved
    pred = predicted(model, 1, "bf16", planner_params(torch.device("cpu")))
    for layer in ("0", "1"):
        kinds = bytes_by_kind(saved, layer)
        assert kinds["weight-cast"] == pred["weight_cast"]
        assert kinds["activation"] == pred["activation"]
    casts = [e for e in breakdown(saved, "0") if e["kind"] == "weight-cast"]
    assert len(casts) == 7 and all(e["dtype"] == "bfloat16" and e["saved_by"] == "linear" for e in casts)


def test_bad_flags_are_one_line(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["--device", "cpu", "--micro-batch", "0"]) == 2
    assert "--micro-batch '0'" in capsys.readouterr().err
    assert main(["--device", "cpu", "--dtype", "bf16"]) == 2
    assert "on CPU the engine computes in fp32" in capsys.readouterr().err

"""``benchmarks/executor/recompute_cost.py --cpu-smoke``: the GPU program's path on a tiny model (all
three variants timed at each micro-batch, the two selective forms' gradients compared, the JSON).
Its timings mean nothing on a CPU."""

from __future__ import annotations

import json

from benchmarks.executor.recompute_cost import VARIANTS, main


def test_smoke_times_every_variant(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["--cpu-smoke", "--out", str(tmp_path)]) == 0
    [path] = tmp_path.glob("recompute_cost_*.json")
    res = json.loads(path.read_text())
    assert [(r["micro_batch"], r["variant"]) for r in res["rows"]] == [(m, v) for m in (1, 2) for v in VARIANTS]
    assert all(r["forward_ms"] > 0 and r["backward_ms"] > 0 for r in res["rows"])
    assert [r["vs_none"] for r in res["rows"] if r["variant"] == "none"] == [1.0, 1.0]
    assert res["gradients"]["bit_equal"] is True and res["gradients"]["agree"] is True
    assert res["meta"]["device"] == "cpu (gloo)"
    assert "| 2 | selective-checkpoint |" in capsys.readouterr().out

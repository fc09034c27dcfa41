"""``benchmarks/executor/weight_casts.py --cpu-smoke``: the three gradient paths run and compute
the same weight gradients (to bf16 rounding), and the JSON records each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.executor.weight_casts import VARIANTS, main


def test_cpu_smoke_runs_every_variant_with_the_same_gradients(tmp_path: Path) -> None:
    assert main(["--cpu-smoke", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("weight_casts_cpu-smoke_tiny_*.json")
    rows = json.loads(path.read_text())["results"]
    assert [r["variant"] for r in rows] == list(VARIANTS)
    assert all("error" not in r and r["ms"] > 0 for r in rows)
    ref = rows[0]["grad_norm"]
    for r in rows[1:]:
        assert r["grad_norm"] == pytest.approx(ref, rel=1e-3)

"""``hexiscale calibrate``'s compiled/eager layer ratio (executor/profiler/compiled.py): the same layer
point timed eager then compiled, the ratio of their forward + backward; the compiled run warms up
at least twice (its first call compiles)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from executor.profiler import compiled as compiled_mod
from planner.model import PRESETS


def test_ratio_of_the_compiled_to_the_eager_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []

    def fake(model: Any, **kw: Any) -> dict[str, Any]:
        calls.append(kw)
        return {"forward_s": 0.3, "backward_s": 0.5} if kw["compiled"] else {"forward_s": 0.4, "backward_s": 0.8}

    monkeypatch.setattr(compiled_mod.compute, "measure_layer", fake)
    out = compiled_mod.compiled_ratio(PRESETS["tiny"], micro_batch=2, dtype="bf16", device=torch.device("cpu"),
                                      warmup=1, repeats=3, chain=4)
    assert out["ratio"] == pytest.approx(0.8 / 1.2)
    assert [c["compiled"] for c in calls] == [False, True]
    assert all(c["warmup"] == compiled_mod.MIN_WARMUP and c["chain"] == 4 and c["tp"] == 1 for c in calls)
    assert out["eager"]["forward_s"] == 0.4 and out["compiled"]["backward_s"] == 0.5

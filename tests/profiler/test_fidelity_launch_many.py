"""The fidelity worker runs many plans in one launch (one process per GPU training plan after plan, each
plan's groups made and destroyed, the initial weights drawn once per model and before the plan's
memory window): each plan reports what a launch of that plan alone reports. The GPU half (the memory
peak per plan) is tests/gpu/test_fidelity_launch_gpu.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from benchmarks.fidelity.engine_start import InitCache
from benchmarks.fidelity.plans import G0, G1, _dp2, _pp2, plan_to_json
from benchmarks.fidelity.worker import run_launch
from executor.model.init import logical_init
from planner.layout import logical_params
from planner.model import PRESETS

TINY = PRESETS["tiny"]
OTHER = replace(PRESETS["tiny"], name="tiny-wide", ffn_hidden_size=2 * PRESETS["tiny"].ffn_hidden_size)


def _losses(res: dict[str, object]) -> dict[str, list[float]]:
    out = {}
    for p in res["plans"]:  # type: ignore[attr-defined]
        assert "error" not in p, p.get("error")
        out[p["name"]] = [r["loss"] for r in p["ranks"]]
    return out


@pytest.mark.slow
def test_each_plan_of_a_launch_reports_what_its_own_launch_does() -> None:
    plans = [("pp2", _pp2(TINY, G0, G1, 1, 4, 2)),  # the model's first plan: half its weights per rank
             ("dp2", _dp2(TINY, G1, G0, 3, 1, 3, 1)),  # same model, the rest of its weights, other groups
             ("other-pp2", _pp2(OTHER, G1, G0, 1, 4, 2))]  # another model: the cache starts again
    entries = [{"name": n, "plan": plan_to_json(p)} for n, p in plans]
    kw = {"cpu": True, "warmup": 1, "steps": 2}
    res = run_launch(entries, [100, 100], **kw)  # type: ignore[arg-type]
    together = _losses(res)
    assert all("weights" in p["phases_s"] for p in res["plans"])  # drawn before each plan's memory window
    for entry in entries[1:]:
        alone = _losses(run_launch([entry], [100, 100], **kw))  # type: ignore[arg-type]
        assert together[entry["name"]] == pytest.approx(alone[entry["name"]], rel=1e-6), entry["name"]
    # the other model's own weights (its loss is not the first model's, which the cache held before it)
    assert together["other-pp2"] != pytest.approx(together["dp2"], rel=1e-6)


def test_weights_on_a_device_are_drawn_one_at_a_time_and_kept_on_the_cpu() -> None:
    """On a GPU the cache draws with the device's generator, one tensor per call, and keeps CPU
    copies (the engine then loads them as training does); on the CPU it is the executor's draw."""
    names = [p.name for p in logical_params(TINY)][:4]
    calls: list[tuple[list[str], object]] = []

    def draw(model, seed, wanted, device=None):  # type: ignore[no-untyped-def]
        calls.append((list(wanted), device))
        return logical_init(model, seed, wanted)  # the CPU's values stand in for the device's here

    meta = torch.device("meta")  # not the CPU: the cache's device path, without a GPU
    cache = InitCache(draw, meta)
    cache.fill(TINY, 0, names)
    assert calls == [([n], meta) for n in names]
    assert all(t.device.type == "cpu" for t in cache.tensors.values())
    cache.fill(TINY, 0, names)  # a later plan of the same model draws nothing
    assert len(calls) == len(names) and cache.drawn == len(names)
    cpu = InitCache(logical_init)
    for n, t in cpu(TINY, 0, names).items():
        assert torch.equal(t, logical_init(TINY, 0, [n])[n])

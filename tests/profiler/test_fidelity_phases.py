"""The fidelity worker's phase clock and its reuse of the initial weights between plans."""

from __future__ import annotations

import torch

from benchmarks.fidelity.engine_start import InitCache, installed
from benchmarks.fidelity.phases import PhaseClock, describe, slowest
from executor.model.init import logical_init
from planner.layout import logical_params
from planner.model import PRESETS


def test_init_cache_draws_each_tensor_once_per_model_with_the_same_values() -> None:
    m = PRESETS["tiny"]
    calls: list[list[str]] = []

    def draw(model, seed, names):  # type: ignore[no-untyped-def]
        calls.append(list(names))
        return logical_init(model, seed, names)

    cache = InitCache(draw)
    names = [p.name for p in logical_params(m)]
    first = cache(m, 0, names[:3])
    again = cache(m, 0, names[:5])  # two new names: only those are drawn
    assert calls == [names[:3], names[3:5]]
    for n, t in logical_init(m, 0, names[:5]).items():
        assert torch.equal(again[n], t)
    assert again[names[0]] is first[names[0]]
    cache(m, 1, names[:1])  # another seed: drawn again, the old tensors dropped
    assert calls[-1] == names[:1] and set(cache.tensors) == {names[0]}
    assert set(cache(m, 1, None)) == set(names)


def test_installed_wraps_the_engine_start_and_restores_it() -> None:
    from executor.train import engine

    before = engine.logical_init, engine.ensure_right_products
    clock = PhaseClock(torch.device("cpu"))
    with installed(lambda: clock) as cache:
        assert engine.logical_init is cache
        assert engine.ensure_right_products is not before[1]
    assert (engine.logical_init, engine.ensure_right_products) == before


def test_phase_clock_sums_and_reports_in_order() -> None:
    clock = PhaseClock(torch.device("cpu"))
    with clock.phase("steps"):
        pass
    clock.add("groups", 1.25)
    clock.add("groups", 0.25)
    assert clock.seconds["groups"] == 1.5 and clock.seconds["steps"] >= 0.0
    assert describe({"teardown": 0.5, "groups": 1.5}) == "groups 1.5 s, teardown 0.5 s"
    assert slowest([{"groups": 1.0, "steps": 3.0}, {"groups": 2.0, "steps": 1.0}]) == {"groups": 2.0, "steps": 3.0}

"""Hypothesis: random valid plans (<= 8 ranks) train exactly like the dense reference."""

from __future__ import annotations

import functools

import pytest
from exec_jobs import ORACLE_OPTIM, TINY, TINY8, global_batches, make_plan, train_plans
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_exec_oracle import STEPS, check_against_reference

from planner.model import ModelSpec
from planner.plan import Plan
from tests.support.reference import reference_train

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("executor-pool")]
MAX_RANKS = 8


@st.composite
def plans(draw: st.DrawFn) -> Plan:
    model = draw(st.sampled_from([TINY, TINY8]))
    tps = [t for t in (1, 2, 4) if model.num_kv_heads % t == 0]
    n_pipes = draw(st.integers(1, 3))
    used = 0
    pipes = []
    for p in range(n_pipes):
        budget = MAX_RANKS - used - (n_pipes - p - 1)  # leave one rank for each later pipeline
        n_stages = draw(st.integers(1, min(3, model.num_layers, budget)))
        stage_tps = []
        for s in range(n_stages):
            room = budget - sum(stage_tps) - (n_stages - s - 1)
            stage_tps.append(draw(st.sampled_from([t for t in tps if t <= room])))
        used += sum(stage_tps)
        cuts = sorted(draw(st.lists(st.integers(1, model.num_layers - 1), min_size=n_stages - 1,
                                    max_size=n_stages - 1, unique=True)))
        bounds = [0, *cuts, model.num_layers]
        layers = [b - a for a, b in zip(bounds, bounds[1:])]
        bs = draw(st.integers(1, 5))
        mb = draw(st.integers(1, bs))
        pipes.append((bs, mb, draw(st.sampled_from(["1f1b", "gpipe"])), list(zip(stage_tps, layers))))
    return make_plan(model, pipes)


@functools.cache
def _reference(model: ModelSpec, batch: int):  # type: ignore[no-untyped-def]
    batches = global_batches(model, batch, STEPS, seed=batch)
    return batches, reference_train(model, batches, optim=ORACLE_OPTIM)


@settings(max_examples=4, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=plans())
def test_random_plans_match_dense_reference(dist_pool, plan: Plan) -> None:
    assert plan.world_size <= MAX_RANKS
    batches, ref = _reference(plan.model, plan.global_batch_size)
    [results] = zip(*dist_pool.run(train_plans, [plan], [batches]))
    check_against_reference(plan, list(results), ref)

"""The oracle for ZB-H1 (split backward, executor.parallel.weight_grad_store): plans whose pipelines run
zero-bubble train exactly like one dense process, with TP changes between stages, beside 1F1B and
GPipe pipelines, under ZeRO 0 and 1, with full recompute, and with fewer micro-batches than stages."""

from __future__ import annotations

from dataclasses import replace

import pytest
from exec_jobs import TINY, TINY8, make_plan
from test_exec_oracle import run_oracle

from planner.plan import Plan

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("executor-pool")]


def _opts(plan: Plan, **options: object) -> Plan:
    return replace(plan, options=replace(plan.options, **options))


PLANS: dict[str, Plan] = {
    "zb-tp2-1-2-three-stages": make_plan(TINY8, [(6, 4, "zb-h1", [(2, 3), (1, 2), (2, 3)])]),
    "zb-beside-1f1b-zero1-uneven-mb": _opts(make_plan(TINY8, [(4, 3, "zb-h1", [(1, 3), (2, 5)]),
                                                              (4, 2, "1f1b", [(2, 8)])]), zero=1),
    "zb-tp4-1-vs-zb-zero1-gpipe": _opts(make_plan(TINY8, [(3, 3, "zb-h1", [(4, 4), (1, 4)]),
                                                          (2, 2, "gpipe", [(1, 8)]),
                                                          (3, 3, "zb-h1", [(1, 2), (1, 6)])]), zero=1),
    "zb-fewer-mb-than-stages-full-recompute": _opts(
        make_plan(TINY, [(2, 2, "zb-h1", [(1, 1), (2, 1), (1, 1), (1, 1)])]), recompute="full"),
}


@pytest.mark.parametrize("name", list(PLANS))
def test_zb_h1_oracle(dist_pool, name: str) -> None:
    run_oracle(dist_pool, PLANS[name])


def test_zb_plans_cover_the_claims() -> None:
    pipes = [p for pl in PLANS.values() for p in pl.pipelines if p.schedule == "zb-h1"]
    assert any(len({s.tp for s in p.stages}) > 1 for p in pipes)
    assert any(p.micro_batches < len(p.stages) for p in pipes)
    assert {pl.options.zero for pl in PLANS.values()} == {0, 1}
    assert any(pl.options.recompute == "full" for pl in PLANS.values())

"""The communicators the executor creates (``executor.parallel.groups.group_sets``), against the count the
cost model charges device memory for (``planner.cost.communicators``), on random plans; and the
global order every rank walks to create and connect them."""

from __future__ import annotations

from collections import Counter

from exec_jobs import TINY8, make_plan
from hypothesis import given, settings
from test_exec_random_plans import plans

from executor.parallel.groups import group_sets
from planner.cost.communicators import communicators
from planner.layout import build_topology
from planner.plan import Plan


def _executor_counts(plan: Plan) -> dict[str, int]:
    count: Counter[int] = Counter(r for _, ranks in group_sets(build_topology(plan)) for r in ranks)
    return {dev: count[r] for r, dev in enumerate(plan.devices)}


@settings(max_examples=150, deadline=None)
@given(plans())
def test_cost_model_counts_the_executors_communicators(plan: Plan) -> None:
    assert communicators(plan) == _executor_counts(plan)


def test_group_sets_of_an_asymmetric_plan() -> None:
    """TP 2 -> 1 next to a one-GPU pipeline: ranks 0,1 | 2 and 3."""
    plan = make_plan(TINY8, [(5, 5, "1f1b", [(2, 3), (1, 5)]), (3, 1, "gpipe", [(1, 8)])])
    sets = group_sets(build_topology(plan))
    assert sets[0] == ("collective", (0, 1, 2, 3))
    assert ("collective", (0, 1)) in sets  # the TP group (also its norm-gradient broadcast group)
    assert sets[-1] == ("p2p", (0, 2))  # the boundary's own group comes last, never shared
    assert {r for kind, r in sets if kind == "collective"} >= {(0, 3), (1, 3), (2, 3)}  # sync groups
    assert len(sets) == len({(k, r) for k, r in sets})

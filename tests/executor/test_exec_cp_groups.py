"""The communicators of a CP plan (pure, no processes): every CP group gets its own communicator
(its K/V all-gathers inside attention must not share one with gradient buckets of the same rank
set, executor.parallel.groups rule 2), created after the collectives and before the p2p pairs."""

from __future__ import annotations

from exec_jobs import TINY, make_plan

from executor.parallel.groups import group_sets
from planner.layout import build_topology


def test_cp_groups_are_their_own_communicators_in_one_global_order() -> None:
    topo = build_topology(make_plan(TINY, [(4, 2, "1f1b", [(2, 4, 2)])]))  # cp 2 x tp 2: ranks 0-3
    assert group_sets(topo) == [
        ("collective", (0, 1, 2, 3)), ("collective", (0, 1)), ("collective", (2, 3)),
        ("collective", (0, 2)), ("collective", (1, 3)),  # gradient sync of the CP slots' equal shards
        ("cp", (0, 2)), ("cp", (1, 3)),  # the same rank sets again, for attention only
    ]


def test_cp_boundary_pairs_follow_the_shared_tokens() -> None:
    topo = build_topology(make_plan(TINY, [(4, 2, "1f1b", [(1, 2, 2), (2, 2)]), (4, 2, "1f1b", [(1, 4)])]))
    sets = group_sets(topo)
    assert sets[-3:] == [("cp", (0, 1)), ("p2p", (0, 2)), ("p2p", (1, 2))]

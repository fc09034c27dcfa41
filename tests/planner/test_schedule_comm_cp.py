"""The messages of CP slot leaders (planner.schedules.slot_comm): every registered schedule, interleaved
1F1B among them, with any mix of cp degrees over its stages (the last-to-first wrap included) pairs
without waits when each exchange is posted whole; waiting for one peer at a time would wait in a
ring; and every pair of slot leaders that exchanges pieces has its own boundary group
(planner.layout.Topology.p2p_pairs)."""

from __future__ import annotations

import itertools

import pytest

from planner.interleave import interleaved
from planner.layout import build_topology
from planner.model import PRESETS
from planner.plan import Pipeline, Plan, PlanOptions, Stage
from planner.schedules import SCHEDULE_NAMES, schedule_named
from planner.schedules.comm import Message, check_pairing, only_exchanges, steps
from planner.schedules.slot_comm import slot_exchanges, slot_parties


def _slot_orders(name: str, cps: tuple[int, ...], m: int) -> list[list[tuple[Message, ...]]]:
    s, n = schedule_named(name), len(cps)
    return slot_exchanges([steps(s.ops(n, i, m), n, i, s.chunks) for i in range(n)], cps)


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_every_schedule_with_cp_stages_pairs_without_waits(name: str) -> None:
    sched = schedule_named(name)
    for n in range(1, 5):
        for m in (n, 2 * n, 2 * n + 1):
            if sched.requires is not None and sched.requires(n, m):
                continue
            for cps in itertools.product((1, 2, 4) if n < 4 else (1, 2), repeat=n):
                assert check_pairing(_slot_orders(name, cps, m)) is None, (name, cps, m)


def test_cp_1_everywhere_is_the_stage_order() -> None:
    s = schedule_named("interleaved-1f1b")
    stage = [steps(s.ops(3, i, 6), 3, i, 2) for i in range(3)]
    assert slot_exchanges(stage, (1, 1, 1)) == [only_exchanges(o) for o in stage]


def test_waiting_for_one_peer_at_a_time_waits_in_a_ring() -> None:
    """The executor posts every piece of an exchange before waiting for any (cp_p2p's _transfer);
    a slot leader waiting peer by peer would deadlock an interleaved cp 1 -> 2 -> 1 pipeline."""
    whole = _slot_orders("interleaved-1f1b", (1, 2, 1), 3)
    assert check_pairing(whole) is None
    by_peer = [[tuple(x for x in ex if x.peer == p) for ex in order for p in sorted({x.peer for x in ex})]
               for order in whole]
    assert "waits in" in (check_pairing(by_peer) or "")


def test_slot_compute_is_a_barrier_of_the_stage() -> None:
    """Stage 0 of cp 2 (parties 0, 1) computes its first forward after no receive: both slots post
    the barrier of op 0 first, each sending to and receiving from the other."""
    orders = _slot_orders("interleaved-1f1b", (2, 1), 2)
    assert slot_parties((2, 1)) == [0, 2]
    assert orders[0][0] == (Message(1, True, ("C", 0, 0)), Message(1, False, ("C", 0, 0)))
    assert orders[1][0] == (Message(0, True, ("C", 0, 0)), Message(0, False, ("C", 0, 0)))
    assert orders[2][0] == (Message(0, False, ("F", 0, 1)), Message(1, False, ("F", 0, 1)))  # both pieces


def _il_plan(stages: list[tuple[int, int, int]]) -> Plan:
    """One interleaved pipeline of tiny-8l from ``(tp, layers, cp)`` stages, devices d:0, d:1, ..."""
    out, at, dev = [], 0, 0
    for tp, n, cp in stages:
        out.append(Stage(tuple(f"d:{dev + i}" for i in range(tp * cp)), tp, (at, at + n), cp))
        at, dev = at + n, dev + tp * cp
    m = len(stages)
    return Plan(PRESETS["tiny-8l"], m, (interleaved(Pipeline(m, m, tuple(out)), 2),), PlanOptions(dtype="fp32"))


@pytest.mark.parametrize("stages", [[(1, 3, 2), (1, 3, 1), (1, 2, 1)], [(1, 4, 2), (2, 4, 1)],
                                    [(2, 3, 1), (1, 3, 2), (1, 2, 2)]])
def test_every_pair_that_exchanges_pieces_has_its_boundary_group(stages: list[tuple[int, int, int]]) -> None:
    plan = _il_plan(stages)
    topo = build_topology(plan)
    ring = topo.pipelines[0][0].stage_leaders
    leaders = [r for g in ring for r in g]  # party -> rank
    cps = tuple(st.cp for st in plan.pipelines[0].stages)
    used = {frozenset((leaders[p], leaders[x.peer])) for p, order in enumerate(_slot_orders("interleaved-1f1b", cps,
                                                                                              len(stages)))
            for ex in order for x in ex if x.what[0] != "C"}
    assert used == {frozenset(pair) for pair in topo.p2p_pairs()}

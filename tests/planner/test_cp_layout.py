"""Context parallelism's pure layout (planner.cp_layout, planner.layout with cp > 1): which tokens a
CP rank holds, what crosses a boundary between stages of different cp, the golden ranks and groups
of a CP plan, and the one-line refusals of what does not run CP yet."""

from __future__ import annotations

import pytest

from planner.cp_layout import boundary_peers, cp_intervals, cp_positions, local_offset, refuse_cp, shared_intervals
from planner.errors import SpecError
from planner.layout import build_topology
from planner.model import PRESETS
from planner.plan import Pipeline, Plan, PlanOptions, Stage

TINY = PRESETS["tiny"]


def _plan(*pipes: tuple[int, list[tuple[int, int, int]]]) -> Plan:
    """``(batch, [(tp, layers, cp), ...])`` per pipeline, synthetic devices."""
    dev, out = 0, []
    for bs, stages in pipes:
        sts, start = [], 0
        for tp, n, cp in stages:
            sts.append(Stage(tuple(f"d:{dev + i}" for i in range(tp * cp)), tp, (start, start + n), cp))
            dev, start = dev + tp * cp, start + n
        out.append(Pipeline(bs, 2, tuple(sts)))
    return Plan(TINY, sum(p[0] for p in pipes), tuple(out), PlanOptions())


def test_causal_balanced_chunks_worked_example() -> None:
    assert cp_intervals(8, 2, 0) == [(0, 2), (6, 8)] and cp_intervals(8, 2, 1) == [(2, 4), (4, 6)]
    assert cp_positions(8, 2, 0) == [0, 1, 6, 7] and cp_intervals(8, 1, 0) == [(0, 8)]
    assert local_offset(8, 2, 0, 6) == 2
    assert sorted(p for r in range(4) for p in cp_positions(32, 4, r)) == list(range(32))
    with pytest.raises(ValueError, match="2 x cp = 4"):
        cp_intervals(10, 2, 0)


def test_boundary_pieces_between_any_cp_degrees() -> None:
    assert shared_intervals(8, 2, 0, 1, 0) == [(0, 2), (6, 8)]
    assert shared_intervals(8, 2, 0, 4, 0) == [(0, 1), (7, 8)] and shared_intervals(8, 2, 0, 4, 1) == [(1, 2), (6, 7)]
    assert boundary_peers(2, 1) == [(0, 0), (1, 0)] and boundary_peers(1, 2) == [(0, 0), (0, 1)]
    assert boundary_peers(2, 2) == [(0, 0), (1, 1)]
    assert boundary_peers(2, 4) == [(0, 0), (0, 1), (1, 2), (1, 3)]


def test_cp_plan_golden_topology() -> None:
    """Pipeline 0: cp 2 x tp 1 (ranks 0, 1; layers 0-2) then tp 2 (2, 3); pipeline 1: one tp-1 stage (4).
    CP slots are owners of their weights like pipelines: embedding and layers 0-1 sync in (0, 1, 4)."""
    topo = build_topology(_plan((4, [(1, 2, 2), (2, 2, 1)]), (4, [(1, 4, 1)])))
    s0, s1, t = topo.stage_of(0), topo.stage_of(1), topo.stage_of(3)
    assert (s0.cp, s0.cp_rank, s1.cp_rank, s0.slots, s1.ranks) == (2, 0, 1, ((0,), (1,)), (1,))
    assert s0.cp_group(0) == (0, 1) and s1.next_leaders == (2,) and t.prev_leaders == (0, 1)
    assert t.uses_cp and not topo.stage_of(4).uses_cp
    assert topo.p2p_pairs() == [(0, 2), (1, 2)]
    groups = {g.ranks: {s.name for s in g.slices} for g in topo.sync_groups}
    assert list(groups) == [(0, 1, 4), (2, 4), (3, 4)]
    assert {"embed.weight", "layers.0.attn.wq.weight", "layers.1.mlp_norm.weight"} <= groups[(0, 1, 4)]
    assert [b.ranks for b in topo.tp_broadcasts] == [(2, 3)]


def test_one_pipeline_cp_stage_syncs_its_slots() -> None:
    """One pipeline of one cp 2 x tp 2 stage: the slots' same TP ranks sum their gradients, and each
    slot leader broadcasts the summed norm gradients in its TP group."""
    topo = build_topology(_plan((4, [(2, 4, 2)])))
    assert [g.ranks for g in topo.sync_groups] == [(0, 2), (1, 3)]
    assert [b.ranks for b in topo.tp_broadcasts] == [(0, 1), (2, 3)]


def test_refusals_name_the_stage_cp() -> None:
    plan = _plan((4, [(1, 2, 1), (1, 2, 2)]))
    with pytest.raises(SpecError) as err:
        refuse_cp(plan, "a strategy pool", "plan the pool's strategies with cp 1")
    assert str(err.value).count("\n") == 0
    assert "pipelines[0].stages[1].cp" in str(err.value) and "with cp 1" in str(err.value)
    refuse_cp(_plan((4, [(1, 4, 1)])), "anything", "no fix needed")  # no cp: no error


def test_pool_refuses_cp_in_one_line() -> None:
    """Hot switching has no CP layouts (a pool refuses them); elastic switching moves state into and
    out of CP layouts (tests/executor/test_exec_switch.py's CP cases)."""
    from planner.varlen.pool import Strategy, StrategyPool

    cp, flat = _plan((4, [(1, 4, 2)])), _plan((4, [(2, 4, 1)]))
    with pytest.raises(SpecError, match=r"strategies\[1\]\.plan\.pipelines\[0\]\.stages\[0\]\.cp"):
        StrategyPool(TINY.seq_len, (Strategy("a", flat), Strategy("b", cp)))


def test_seed_flags_refuse_cp_and_relabelling_keeps_it() -> None:
    """The seeds' flags have no cp (a converted CP plan would be another layout): one line. Elastic
    re-planning's device relabelling keeps a stage's cp (it used to drop it)."""
    from planner.replan import _rename
    from planner.seed_flags import plan_to_flags

    plan = _plan((4, [(1, 2, 1), (2, 2, 2)]))
    with pytest.raises(SpecError, match=r"pipelines\[0\]\.stages\[1\]\.cp.*seed systems' flags"):
        plan_to_flags(plan)
    renamed = _rename(plan, {d: "x" + d for d in plan.devices})
    assert [s.cp for s in renamed.pipelines[0].stages] == [1, 2] and renamed.devices[0] == "xd:0"

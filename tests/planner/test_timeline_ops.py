"""A lane's forward/backward spans named by its schedule's ops (planner.timeline_ops): the simulated
ZB-H1 step pairs one to one with the registry's order, and a lane that ran another order is refused
naming the first op that differs."""

from __future__ import annotations

import pytest

from planner.cost.sim_timeline import stage_lane
from planner.cost.simulate import simulate
from planner.schedules import StageOp, schedule_named
from planner.timeline import Lane, Span
from planner.timeline_ops import op_times, seconds_by_kind


def test_a_simulated_zb_h1_step_pairs_with_the_registry_order() -> None:
    f, b, w = [1.0, 1.0, 1.0], [2.0, 2.0, 2.0], [0.75, 0.75, 0.75]
    sim = simulate(f, b, 4, "zb-h1", record=True, wgrad=w)
    for i in range(3):
        lane = stage_lane(0, i, sim.ops[i], [f[i]] * 4, [b[i]] * 4, [w[i]] * 4)
        times = op_times(lane, schedule_named("zb-h1").ops(3, i, 4))
        assert [t.op for t in times] == schedule_named("zb-h1").ops(3, i, 4)
        assert seconds_by_kind(times) == pytest.approx({"F": 4.0, "B": 5.0, "W": 3.0})


def test_a_lane_that_ran_another_order_is_refused() -> None:
    ops = [StageOp("F", 0), StageOp("B", 0), StageOp("W", 0)]
    lane = Lane("p0 s1 r1", 0, 1, [Span("forward", 0, 0, 1), Span("p2p", 0, 1, 2), Span("forward", 1, 2, 3)])
    with pytest.raises(ValueError, match="p0 s1 r1: op 1 ran the forward of micro-batch 1; the schedule's op 1 is B"):
        op_times(lane, ops)
    short = Lane("p0 s0 r0", 0, 0, [Span("forward", 0, 0, 1), Span("backward", 0, 1, 2)])
    with pytest.raises(ValueError, match="2 forward/backward spans, the schedule has 3 ops"):
        op_times(short, ops)

"""planner.schedules.inline_w: the W ops a stage fuses into their B, from its op order alone."""

from __future__ import annotations

from planner.schedules import StageOp, schedule_named
from planner.schedules.inline_w import inline_w


def test_zb_h1_fuses_every_w_of_its_first_stage_only() -> None:
    zb = schedule_named("zb-h1")
    for stages, m in ((2, 3), (4, 8), (4, 4), (4, 2), (1, 4)):
        assert inline_w(zb.ops(stages, 0, m), True) == {(j, 0) for j in range(m)}
        for i in range(1, stages):  # a later stage's B sends its input gradient: never fused
            assert inline_w(zb.ops(stages, i, m), False) == frozenset(), (stages, i, m)


def test_a_later_stage_does_not_fuse_even_an_adjacent_w() -> None:
    # stage 1 of 4 at m=2: two warm-up forwards, then only cool-down: F0 F1 B0 W0 B1 W1; fusing would
    # delay each B's send to stage 0 by the W
    ops = schedule_named("zb-h1").ops(4, 1, 2)
    assert ops[2:4] == [StageOp("B", 0), StageOp("W", 0)]
    assert inline_w(ops, False) == frozenset() and inline_w(ops, True) == {(0, 0), (1, 0)}


def test_only_the_adjacent_w_of_the_same_micro_batch_and_chunk_counts() -> None:
    ops = [StageOp("F", 0), StageOp("F", 1), StageOp("B", 0), StageOp("F", 2), StageOp("W", 0),
           StageOp("B", 1), StageOp("W", 1, 1), StageOp("W", 1), StageOp("B", 2), StageOp("W", 2)]
    assert inline_w(ops, True) == {(2, 0)}


def test_schedules_without_w_ops_fuse_nothing() -> None:
    for name in ("1f1b", "gpipe"):
        assert inline_w(schedule_named(name).ops(4, 0, 8), True) == frozenset()

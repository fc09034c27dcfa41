"""planner.schedules.inline_w: the W ops a stage fuses into their B, from its op order alone."""

from __future__ import annotations

from planner.schedules import StageOp, schedule_named
from planner.schedules.inline_w import inline_w


def test_zb_h1_fuses_every_w_of_its_first_stage_only() -> None:
    zb = schedule_named("zb-h1")
    for stages, m in ((2, 3), (4, 8), (4, 4), (1, 4)):
        assert inline_w(zb.ops(stages, 0, m)) == {(j, 0) for j in range(m)}
        for i in range(1, stages):  # stage i holds i W's back: the W after a B is an older micro-batch's
            assert inline_w(zb.ops(stages, i, m)) == frozenset(), (stages, i, m)


def test_zb_h1_with_fewer_micro_batches_than_warm_up_forwards_holds_nothing_back() -> None:
    # stage 1 of 4 at m=2: two warm-up forwards, then only cool-down: F0 F1 B0 W0 B1 W1
    assert inline_w(schedule_named("zb-h1").ops(4, 1, 2)) == {(0, 0), (1, 0)}
    assert inline_w(schedule_named("zb-h1").ops(4, 2, 2)) == frozenset()  # F0 F1 B0 B1 W0 W1


def test_only_the_adjacent_w_of_the_same_micro_batch_and_chunk_counts() -> None:
    ops = [StageOp("F", 0), StageOp("F", 1), StageOp("B", 0), StageOp("F", 2), StageOp("W", 0),
           StageOp("B", 1), StageOp("W", 1, 1), StageOp("W", 1), StageOp("B", 2), StageOp("W", 2)]
    assert inline_w(ops) == {(2, 0)}


def test_schedules_without_w_ops_fuse_nothing() -> None:
    for name in ("1f1b", "gpipe"):
        assert inline_w(schedule_named(name).ops(4, 0, 8)) == frozenset()

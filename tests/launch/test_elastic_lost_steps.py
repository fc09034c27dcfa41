"""How many completed steps an elastic job's failure lost (the supervisor's recovery line and its
``recovery`` event): the verdict's step is the dead rank's last heartbeat, which can lag the training
under load, so a kill right after a checkpoint may report a step at or before the checkpoint's. The
count is then 0, never negative (a CI run of 2026-11-27 printed a line the recovery test could not read)."""

from __future__ import annotations

from hexiscale.launch.elastic import lost_steps


def test_steps_after_the_checkpoint_up_to_the_failed_one_are_lost() -> None:
    assert lost_steps(failed_step=37, resume_step=30) == 6  # steps 31..36 completed, 37 failed
    assert lost_steps(failed_step=31, resume_step=30) == 0


def test_a_heartbeat_lagging_behind_the_checkpoint_loses_nothing_not_a_negative_count() -> None:
    assert lost_steps(failed_step=30, resume_step=30) == 0
    assert lost_steps(failed_step=29, resume_step=30) == 0
    assert lost_steps(failed_step=0, resume_step=0) == 0  # a failure during set-up

"""The elastic ranks plan the next epoch's state move between two steps as soon as its plan is
known: from the plan the supervisor writes before starting the joiners, checked against the go."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch.distributed as dist
from exec_jobs import TINY, make_plan

from executor import elastic_train
from executor.elastic_channel import Channel

OLD = make_plan(TINY, [(4, 2, "1f1b", [(2, 4)]), (4, 2, "1f1b", [(1, 4)])])  # d:0-1 TP 2 | d:2
NEW = make_plan(TINY, [(4, 2, "1f1b", [(1, 2), (1, 2)]), (4, 2, "1f1b", [(1, 4)])])  # d:0 | d:1 ; d:2
OTHER = make_plan(TINY, [(8, 2, "1f1b", [(1, 4)])])  # d:0 alone


@pytest.fixture
def job_ep() -> tuple[SimpleNamespace, SimpleNamespace]:
    job = SimpleNamespace(channel=Channel(dist.HashStore(), "job"), cluster=None, move=None)
    return job, SimpleNamespace(index=0, plan=OLD)


def test_the_move_is_planned_from_the_written_plan_and_kept_by_the_same_go(job_ep) -> None:  # type: ignore[no-untyped-def]
    job, ep = job_ep
    elastic_train._plan_ahead(job, ep)
    assert job.move is None  # nothing written yet
    job.channel.publish_plan(1, NEW)  # the supervisor, before its joiners are ready
    elastic_train._plan_ahead(job, ep)
    ahead = job.move
    assert ahead is not None and not ahead.confirmed and (ahead.old, ahead.new) == (OLD, NEW)
    elastic_train._plan_ahead(job, ep)  # planned once
    assert job.move is ahead
    job.channel.publish_epoch(1, OLD, NEW)  # the go names the same two plans
    elastic_train._plan_ahead(job, ep)  # the next step boundary checks it against the go
    assert job.move.confirmed and job.move.rp is ahead.rp
    move, was_ahead = elastic_train._plan_move(job, 1, 0.0)
    assert was_ahead and move.confirmed and move.rp is ahead.rp and move.plan_s == ahead.plan_s


def test_a_go_naming_another_plan_is_planned_again(job_ep) -> None:  # type: ignore[no-untyped-def]
    job, ep = job_ep
    job.channel.publish_plan(1, NEW)
    elastic_train._plan_ahead(job, ep)
    stale = job.move
    job.channel.forget_ready(1, [])  # that change failed; epoch 1 is another change now
    job.channel.publish_plan(1, OTHER)
    job.channel.publish_epoch(1, OLD, OTHER)
    move, was_ahead = elastic_train._plan_move(job, 1, 0.0)
    assert not was_ahead and move.confirmed and move.new == OTHER and move.rp is not stale.rp
    assert move.rp.new.devices == OTHER.devices


def test_without_a_written_plan_the_go_is_waited_for(job_ep) -> None:  # type: ignore[no-untyped-def]
    job, _ = job_ep
    with pytest.raises(Exception, match="epoch 1 was not published"):
        elastic_train._plan_move(job, 1, 0.05)

"""A join's move planned and its engine built before the go (executor.switch.elastic_switch): from
``plan/<e>``, which the supervisor writes before it starts the joiners, every rank plans its state
move — a staying rank between two steps, or at the switch point while the joiners still start; a
joiner before it reports ready — and what was done before the go is charged to no switch
(``late_s`` 0). What the go found unplanned, or planned for another layout (a change that failed
and was planned again under the same epoch number), is planned after it and charged to the switch.
One process, a store, no process group: nothing here times anything."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist

from executor.switch.elastic_channel import Channel, layouts
from executor.switch.elastic_switch import ElasticJob, plan_joined
from executor.train.config import TrainConfig
from executor.train.setup import optim_config
from tests.support.random_plans import TINY, named_plan

OLD = named_plan(TINY, [(3, [(["a:0"], 4)]), (3, [(["a:1"], 4)])], zero=1)
NEW = named_plan(TINY, [(2, [(["a:0"], 4)]), (2, [(["a:1"], 4)]), (2, [(["a:2"], 4)])], zero=1)
OTHER = named_plan(TINY, [(2, [(["a:0"], 2), (["a:2"], 2)]), (4, [(["a:1"], 4)])], zero=1)


def _job(me: str) -> tuple[ElasticJob, Channel]:
    """``me``'s elastic job, as far as planning moves and building engines goes."""
    channel = Channel(dist.HashStore(), "t")
    args = TrainConfig()
    prep: Any = SimpleNamespace(device=torch.device("cpu"))
    fields: Any = None  # what only the switch itself uses
    return ElasticJob(args, me, fields, channel.store, channel, fields, prep, optim_config(args), None, None,
                      fields), channel


def test_planned_record_gives_both_layouts_before_the_go() -> None:
    channel = Channel(dist.HashStore(), "t")
    assert channel.planned(1) is None
    channel.publish_plan(1, OLD, NEW)
    text = channel.planned(1)
    assert text is not None and layouts(text) == (OLD, NEW) and not channel.published(1)


def test_staying_rank_at_the_switch_point_plans_and_builds_while_the_joiner_starts() -> None:
    job, channel = _job("a:0")
    channel.publish_plan(1, OLD, NEW)
    job.while_waiting(1)  # the boundary came, the joiner is not ready: no go yet
    assert job.move is not None and job.move.ahead and job.early is not None and job.early.ahead
    planned, early = job.move, job.early
    channel.publish_epoch(1, OLD, NEW)  # the joiner is ready
    move = job.plan_move(1, 1.0)
    assert move is planned and job.late_s(move) == 0.0  # neither is on the switch's path
    assert job.early is early and early.into.state == move.states[1]
    assert early.in_wait  # not between two steps: the downtime does not count it twice


def test_switch_point_before_the_plan_is_written_waits_for_it() -> None:
    """A trace's boundary can come before the supervisor writes ``plan/<e>`` (it plans the next
    change once the last leaver has exited): the rank waits for it, not for the go, to plan ahead."""
    job, channel = _job("a:1")
    writer = threading.Timer(0.2, channel.publish_plan, (1, OLD, NEW))
    writer.start()
    job.while_waiting(1)
    writer.join()
    assert job.move is not None and job.move.ahead and job.early is not None and job.early.ahead


def test_what_the_go_finds_unplanned_is_charged_to_the_switch() -> None:
    job, channel = _job("a:0")
    channel.publish_plan(1, OLD, NEW)
    channel.publish_epoch(1, OLD, NEW)  # the go was given before this rank came to the switch point
    job.while_waiting(1)
    assert job.move is None and job.early is None
    move = job.plan_move(1, 1.0)
    assert not move.ahead and job.late_s(move) == move.plan_s > 0


def test_between_two_steps_counts_as_ahead_after_the_go_too() -> None:
    job, channel = _job("a:1")
    channel.publish_plan(1, OLD, NEW)
    channel.publish_epoch(1, OLD, NEW)
    move = job.plan_ahead(1, between_steps=True)
    assert move is not None and move.ahead and job.plan_move(1, 1.0) is move and job.late_s(move) == 0.0


def test_a_change_planned_again_under_the_same_epoch_is_planned_anew() -> None:
    job, channel = _job("a:0")
    channel.publish_plan(1, OLD, NEW)
    job.while_waiting(1)
    assert job.early is not None and job.early.layout == NEW
    channel.forget_ready(1, ["a:2"])  # the joiner failed before its go
    assert job.plan_ahead(1, between_steps=True) is None and job.move is None and job.early is None
    channel.publish_plan(1, OLD, OTHER)
    job.while_waiting(1)
    assert job.move is not None and job.move.new == OTHER and job.early is not None and job.early.layout == OTHER
    channel.publish_epoch(1, OLD, OTHER)
    assert job.plan_move(1, 1.0).new == OTHER and job.late_s(job.plan_move(1, 1.0)) == 0.0


def test_a_stale_move_is_not_used_for_another_go() -> None:
    job, channel = _job("a:0")
    channel.publish_plan(1, OLD, NEW)
    stale = job.plan_ahead(1, between_steps=True)
    channel.publish_epoch(1, OLD, OTHER)  # (a supervisor never does this: the guard behind the reuse)
    move = job.plan_move(1, 1.0)
    assert move is not stale and move.new == OTHER and not move.ahead


@pytest.mark.parametrize("layout, planned", [(NEW, True), (OTHER, False)])
def test_joiner_plans_its_move_before_it_reports_ready(layout: Any, planned: bool) -> None:
    channel = Channel(dist.HashStore(), "t")
    channel.publish_plan(1, OLD, NEW)
    move, text = plan_joined(channel, 1, layout, cluster=None, me="a:2")
    assert (move is not None) == planned and (text is not None) == planned
    if move is not None:
        assert move.ahead and move.states[0] is None and move.states[1] is not None
        assert move.states[1].device == "a:2"

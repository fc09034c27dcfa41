"""Refuse, before any rank starts, a plan (or strategy pool) whose schedule the executor does not
train yet: the launcher and the executor's pre-flight both ask here. Interleaved pipelines train,
but not where layouts switch while training (a strategy pool, an elastic job): the launcher and
the pool itself ask :func:`check_no_chunks`."""

from __future__ import annotations

from planner.errors import SpecError
from planner.plan import Plan
from planner.schedules.registry import schedule_named


def check_plan_trained(plan: Plan, prefix: str = "") -> None:
    """Every pipeline's schedule is one the executor runs; else one :class:`~planner.errors.SpecError` naming
    ``{prefix}pipelines[P].schedule``."""
    for pi, pipe in enumerate(plan.pipelines):
        field = f"{prefix}pipelines[{pi}].schedule"
        schedule_named(pipe.schedule, field).check_trained(field)


def check_no_chunks(plan: Plan, prefix: str = "", why: str = "a strategy pool or an elastic job") -> None:
    """Refuse, as one :class:`~planner.errors.SpecError` naming ``{prefix}pipelines[P].schedule``, an
    interleaved pipeline where layouts switch while training (``why``): switching moves state
    between layouts of one layer range per stage."""
    for pi, pipe in enumerate(plan.pipelines):
        if schedule_named(pipe.schedule).chunks > 1:
            raise SpecError(f"{prefix}pipelines[{pi}].schedule", f"{pipe.schedule} is not trained in {why} "
                            "(switching layouts moves state between stages of one layer range)",
                            "use 1f1b, gpipe or zb-h1 there (hexiscale plan --elastic plans so), or train the "
                            "interleaved plan alone")

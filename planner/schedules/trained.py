"""Refuse, before any rank starts, a plan (or strategy pool) whose schedule the executor does not
train yet: the launcher and the executor's pre-flight both ask here."""

from __future__ import annotations

from planner.plan import Plan
from planner.schedules.registry import schedule_named


def check_plan_trained(plan: Plan, prefix: str = "") -> None:
    """Every pipeline's schedule is one the executor runs; else one :class:`~planner.errors.SpecError` naming
    ``{prefix}pipelines[P].schedule``."""
    for pi, pipe in enumerate(plan.pipelines):
        field = f"{prefix}pipelines[{pi}].schedule"
        schedule_named(pipe.schedule, field).check_trained(field)

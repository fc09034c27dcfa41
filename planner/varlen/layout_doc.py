"""A training layout as data: a plan or a strategy pool, told apart by its ``format`` (pure).

An elastic job may run either (:mod:`executor.switch.elastic_channel` publishes each epoch's layout as
JSON); what numbers its ranks — and what holds its state — is the *home plan*: the plan itself, or
the pool's home strategy's plan.
"""

from __future__ import annotations

from typing import Any

from planner.plan import Plan, plan_from_dict, plan_to_dict
from planner.varlen.pool import POOL_FORMAT, StrategyPool, pool_from_dict

Layout = Plan | StrategyPool


def home_plan(layout: Layout) -> Plan:
    """The plan that numbers the layout's ranks and holds its training state."""
    return layout.home_plan if isinstance(layout, StrategyPool) else layout


def layout_to_dict(layout: Layout) -> dict[str, Any]:
    return layout.to_dict() if isinstance(layout, StrategyPool) else plan_to_dict(layout)


def layout_from_dict(data: Any) -> Layout:
    """A pool if ``format`` says so, else a plan (each checked as its loader checks it)."""
    if isinstance(data, dict) and data.get("format") == POOL_FORMAT:
        return pool_from_dict(data)
    return plan_from_dict(data)

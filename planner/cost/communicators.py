"""How many NCCL communicators each device belongs to (their buffers are device memory).

The executor (``executor.parallel.groups``) creates, before the first step: the default group (every
plan device, when there are several), one group per TP stage of more than one device, one group
per distinct owner set of the finest-common gradient slices (:mod:`planner.cost.gradsync`), and
one dedicated two-device group per stage boundary (its two leaders). Rank sets that coincide are
one communicator, except the boundary groups, which always get their own. A CP stage
(:mod:`planner.cost.context`) has one TP group per slot and one CP group per TP rank.
"""

from __future__ import annotations

from collections import Counter

from planner.cost.context import cp_groups, cp_slots
from planner.cost.gradsync import sync_groups
from planner.plan import Plan


def communicators(plan: Plan) -> dict[str, int]:
    """``{device: number of communicators it belongs to}``."""
    sets: set[tuple[str, ...]] = set()
    devices = tuple(plan.devices)
    if len(devices) > 1:
        sets.add(devices)
    boundaries: Counter[str] = Counter()
    for pipe in plan.pipelines:
        for si, st in enumerate(pipe.stages):
            if st.tp > 1:
                sets.update(cp_slots(st.devices, st.tp))
            if st.cp > 1:
                sets.update(cp_groups(st.devices, st.tp))
            if si + 1 < len(pipe.stages):
                boundaries[st.devices[0]] += 1
                boundaries[pipe.stages[si + 1].devices[0]] += 1
    sets.update(g for g in sync_groups(plan) if len(set(g)) > 1)
    count: Counter[str] = Counter()
    for ranks in sets:
        for d in set(ranks):
            count[d] += 1
    return {d: count[d] + boundaries[d] for d in devices}


def stage_communicators(tp: int, first: bool, last: bool, cp: int = 1) -> int:
    """A lower bound for one device of a stage, before the plan is known (the search's surrogate):
    the default group, its TP group, its CP group, its stage boundaries and one gradient-sync group."""
    boundaries = 0 if first and last else 1 if first or last else 2
    return 2 + (tp > 1) + (cp > 1) + boundaries

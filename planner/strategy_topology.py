"""The topology of a pool strategy in the job's rank numbering (pure, no torch).

A job's processes are numbered by the *home* plan (rank ``r`` drives the home plan's ``r``-th
device, and its GPU). Another strategy of the pool lists the same devices, possibly in another
order, so its own rank ``r'`` (plan order) is the job rank of the device in that position. This
module builds the strategy's :class:`~planner.layout.Topology` and renames every rank in it —
stage groups, p2p peers, gradient-sync groups, TP broadcasts — to job ranks. Sync groups keep
their owners in pipeline order, and are re-sorted by their renamed rank tuples, so every rank
walks them in the same global order (what :mod:`executor.parallel.grad_sync` and :mod:`executor.parallel.groups`
rely on).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from planner.errors import SpecError
from planner.layout import StageTopo, SyncGroup, Topology, TPBroadcast, build_topology
from planner.plan import Plan


def rank_map(plan: Plan, devices: Sequence[str]) -> list[int]:
    """``out[r]`` = job rank of ``plan``'s rank ``r``; ``devices[j]`` is job rank ``j``'s device."""
    where = {d: j for j, d in enumerate(devices)}
    if sorted(plan.devices) != sorted(devices):
        raise SpecError("strategies", f"a strategy uses devices {sorted(plan.devices)}, the job {sorted(devices)}",
                        "every strategy of a pool runs on the same devices")
    return [where[d] for d in plan.devices]


def _rename_stage(st: StageTopo, m: Sequence[int]) -> StageTopo:
    return replace(st, ranks=tuple(m[r] for r in st.ranks),
                   prev_leader=None if st.prev_leader is None else m[st.prev_leader],
                   next_leader=None if st.next_leader is None else m[st.next_leader],
                   slots=tuple(tuple(m[r] for r in g) for g in st.slots),
                   prev_leaders=tuple(m[r] for r in st.prev_leaders), next_leaders=tuple(m[r] for r in st.next_leaders),
                   stage_leaders=tuple(tuple(m[r] for r in g) for g in st.stage_leaders))


def strategy_topology(plan: Plan, devices: Sequence[str]) -> Topology:
    """``plan``'s topology with job ranks (``devices[j]`` = job rank ``j``'s device)."""
    topo = build_topology(plan)
    m = rank_map(plan, devices)
    if m == list(range(len(m))):
        return topo
    pipes = tuple(tuple(_rename_stage(st, m) for st in pipe) for pipe in topo.pipelines)
    sync = tuple(sorted((SyncGroup(tuple(m[r] for r in g.ranks), g.slices) for g in topo.sync_groups),
                        key=lambda g: g.ranks))
    bcast = tuple(sorted((TPBroadcast(tuple(m[r] for r in b.ranks), b.names) for b in topo.tp_broadcasts),
                         key=lambda b: b.ranks))
    return Topology(topo.model, topo.world_size, pipes, sync, bcast)

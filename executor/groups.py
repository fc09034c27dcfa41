"""torch.distributed process groups for a :class:`~executor.topology.Topology`.

``ProcessGroups.create`` is collective over the default group: every rank (including ranks beyond
the plan's world size, which some tests use to run small plans in a large worker pool) calls
``new_group`` for the same rank sets in the same order — the plan's ranks, then every TP group,
then every gradient-sync group and TP-broadcast group, deduplicated and in topology order. Sets of
one rank get no group (their collectives are no-ops). Nothing here touches CUDA, so it works with
gloo on CPU and NCCL on GPU alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from executor.topology import StageTopo, Topology


@dataclass
class ProcessGroups:
    topology: Topology
    rank: int  # this process's global rank
    world: Any  # group of the plan's ranks (None if this rank is not in the plan)
    by_ranks: dict[tuple[int, ...], Any] = field(default_factory=dict)

    @property
    def in_plan(self) -> bool:
        return self.rank < self.topology.world_size

    @property
    def stage(self) -> StageTopo:
        return self.topology.stage_of(self.rank)

    @property
    def tp_group(self) -> Any:
        return self.group(self.stage.ranks)

    @property
    def tp_rank(self) -> int:
        return self.stage.ranks.index(self.rank)

    def group(self, ranks: tuple[int, ...]) -> Any:
        """The group of exactly ``ranks`` (None for a single rank)."""
        if len(ranks) == 1:
            return None
        return self.by_ranks[tuple(ranks)]

    @classmethod
    def create(cls, topology: Topology, backend: str | None = None) -> ProcessGroups:
        """Create every group of ``topology`` (collective over the default group).

        ``backend`` defaults to the default group's backend.
        """
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised (init_process_group first)")
        size = dist.get_world_size()
        if size < topology.world_size:
            raise RuntimeError(f"the plan needs {topology.world_size} ranks, torch.distributed has {size}")
        rank = dist.get_rank()
        backend = backend or dist.get_backend()
        plan_ranks = tuple(range(topology.world_size))
        wanted: list[tuple[int, ...]] = []
        if size > topology.world_size and len(plan_ranks) > 1:
            wanted.append(plan_ranks)
        wanted += topology.tp_groups()
        wanted += [g.ranks for g in topology.sync_groups]
        wanted += [b.ranks for b in topology.tp_broadcasts]
        by_ranks: dict[tuple[int, ...], Any] = {}
        for ranks in wanted:
            if len(ranks) < 2 or ranks in by_ranks:
                continue
            by_ranks[ranks] = dist.new_group(list(ranks), backend=backend)
        if size == topology.world_size:
            world: Any = dist.group.WORLD
            by_ranks[plan_ranks] = world
        elif len(plan_ranks) == 1:
            world = None
        else:
            world = by_ranks[plan_ranks]
        return cls(topology=topology, rank=rank, world=world if rank < topology.world_size else None,
                   by_ranks=by_ranks)

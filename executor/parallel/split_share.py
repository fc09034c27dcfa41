"""NCCL communicators split off the default group *sharing its resources* (``ncclConfig_t.splitShare``).

With ``init_process_group(..., device_id=...)`` every ``new_group`` is already an ``ncclCommSplit``
of the default communicator (torch passes ``split_from``); with ``split_share`` the child also
shares the parent's proxy, buffers and peer connections instead of setting up its own, which is
where a split's time goes (0.16-1.09 s for a plan's groups in an elastic switch on 4x H200,
``benchmarks/executor/elastic.py``; ``benchmarks/executor/p2p_connect.py`` times both kinds).

The price: NCCL orders the launches of communicators that share resources, one after another in
issue order on each rank, as if they were one communicator. Rule 2 of
:mod:`executor.parallel.groups` (one traffic class per communicator) exists because two traffic
classes on one communicator can be issued in different orders on two ranks; so only groups whose
operations every member issues in one global order may share: the gradient-sync groups (buckets
and ZeRO-1's all-gathers are launched in the topology's global order, :mod:`executor.parallel.grad_sync`;
the default group's own operations come after them in every rank's program). Each rank issues a
subsequence of that one order, so no two ranks wait on each other. TP groups, TP broadcasts and
stage-boundary p2p groups keep their own resources (:func:`shared_sets`).
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from planner.layout import Topology


def shared_sets(topology: Topology) -> set[tuple[int, ...]]:
    """The rank sets of ``topology`` whose groups may share the default group's resources (pure):
    gradient-sync groups that are not also a TP group, a TP broadcast or the plan's ranks."""
    own = {*topology.tp_groups(), *(b.ranks for b in topology.tp_broadcasts), *topology.p2p_pairs(),
           tuple(range(topology.world_size))}
    return {g.ranks for g in topology.sync_groups if len(g.ranks) > 1} - own


def split_share_options() -> Any | None:
    """Options for ``new_group`` that make an NCCL split share the default group's resources; None
    where there is nothing to share (no NCCL, a default group not bound to a device — then
    ``new_group`` does not split — or an NCCL config without ``split_share``)."""
    if not dist.is_initialized() or dist.get_backend() != "nccl" or not dist.is_nccl_available():
        return None
    if getattr(dist.distributed_c10d._get_default_group(), "bound_device_id", None) is None:
        return None
    opts = dist.ProcessGroupNCCL.Options()
    opts.is_high_priority_stream = False  # torch's default for groups created without options
    if not hasattr(opts.config, "split_share"):
        return None
    opts.config.split_share = 1
    return opts

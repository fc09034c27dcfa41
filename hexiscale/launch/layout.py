"""Which process runs where: the plan's ranks grouped by node (pure; no torch).

Each node of the cluster that the plan uses gets one process per plan device on it. Nodes are
numbered (``node_rank``) in the order their first plan rank appears, so node 0 holds global rank
0 and hosts the rendezvous. Inside a node, processes are ordered by plan rank: local rank ``i`` is
the node's ``i``-th plan rank, and ``CUDA_VISIBLE_DEVICES`` lists the matching GPU indices in that
order, so local rank ``i`` always uses ``cuda:i``.

Worked example (``examples/plans/demo-cpu-6-tiny.json`` on ``demo-cpu-6``): ranks 0,1 are a100:0,1
and ranks 2..5 are r4090:0..3, so node 0 = a100 (ranks [0, 1], CUDA_VISIBLE_DEVICES=0,1) and node
1 = r4090 (ranks [2, 3, 4, 5], CUDA_VISIBLE_DEVICES=0,1,2,3). A plan whose ranks on a node are not
contiguous (ranks 0-3 and 8-11 on one node) is fine: the node's processes carry
``HEXISCALE_NODE_RANKS=0,1,2,3,8,9,10,11`` and each one takes the global rank at its local index
(the launcher's own numbering, e.g. torchrun's, is ignored; see ``executor.job.env``).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cluster import ClusterSpec
from planner.plan import Plan
from planner.validate import validate


@dataclass(frozen=True)
class Slot:
    """One process: its global (plan) rank, its device id and the GPU index on its node."""

    rank: int
    device: str
    gpu: int


@dataclass(frozen=True)
class NodeLaunch:
    name: str
    node_rank: int
    gpus: int  # GPUs the node has (the plan may use fewer)
    slots: tuple[Slot, ...]  # in plan-rank order

    @property
    def nproc(self) -> int:
        return len(self.slots)

    @property
    def ranks(self) -> list[int]:
        return [s.rank for s in self.slots]

    @property
    def visible_devices(self) -> str:
        return ",".join(str(s.gpu) for s in self.slots)

    @property
    def rank_list(self) -> str:
        return ",".join(str(r) for r in self.ranks)


@dataclass(frozen=True)
class LaunchLayout:
    world_size: int
    nodes: tuple[NodeLaunch, ...]

    @property
    def uniform(self) -> bool:
        """True when every node runs the same number of processes (one torchrun line fits all)."""
        return len({n.nproc for n in self.nodes}) == 1

    def node(self, name: str) -> NodeLaunch:
        for n in self.nodes:
            if n.name == name:
                return n
        from planner.errors import SpecError

        raise SpecError("--node", f"node {name!r} runs no rank of this plan",
                        f"nodes in the plan: {', '.join(n.name for n in self.nodes)}")


def build_layout(plan: Plan, cluster: ClusterSpec) -> LaunchLayout:
    """Group the plan's ranks by node (the plan must fit the cluster)."""
    validate(plan, cluster)
    by_node: dict[str, list[Slot]] = {}
    for info in plan.ranks():
        dev = cluster.device(info.device)
        by_node.setdefault(dev.node, []).append(Slot(info.rank, info.device, dev.local_index))
    nodes = tuple(NodeLaunch(name, i, cluster.node(name).gpus, tuple(slots))
                  for i, (name, slots) in enumerate(by_node.items()))
    return LaunchLayout(plan.world_size, nodes)

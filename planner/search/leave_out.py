"""Which nodes the search tries leaving out (issue 31: on one NVLink node plus a PCIe node behind a
0.5 GB/s link, the NVLink node alone is faster than all 16 GPUs). :meth:`.planner.Search.leave_out`
sweeps the best template on the cluster without each set; :mod:`.idle` explains what a plan left out."""

from __future__ import annotations

from collections import Counter

from planner.cluster import ClusterSpec
from planner.search.stages import node_kinds


def leave_out_subsets(cluster: ClusterSpec) -> list[tuple[str, frozenset[str]]]:
    """Nodes to leave out, one set at a time: each node kind, and each node group, one of every set of
    groups alike (the same node kinds and link: leaving out one rack of 64 identical ones is the same
    question as any other); never every node."""
    out: dict[frozenset[str], str] = {}
    kinds = node_kinds(cluster)
    if len(kinds) > 1:
        for (gpu, gpus), names in kinds.items():
            out.setdefault(frozenset(names), f"the {len(names)} {gpu} x{gpus} node(s)")
    alike: set[tuple[object, ...]] = set()
    for g in cluster.groups:
        shape = (tuple(sorted(Counter((cluster.node(n).gpu, cluster.node(n).gpus) for n in g.nodes).items())), g.link)
        if shape not in alike:
            alike.add(shape)
            out.setdefault(frozenset(g.nodes), f"group {g.name}")
    everything = frozenset(n.name for n in cluster.nodes)
    return [(label, nodes) for nodes, label in out.items() if nodes and nodes != everything]

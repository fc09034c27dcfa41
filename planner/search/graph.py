"""The device graph and the stage units the planner partitions.

**Device graph** (:func:`device_graph`): one vertex per GPU, weighted by ``compute`` (peak dense
TFLOP/s of the plan's dtype divided by the device's slowdown) and ``memory_gib``; one edge per
pair of GPUs on the same node (weight = intra-node bandwidth, GB/s) and "rail" edges between
device ``i`` of two nodes (weight = the node pair's link bandwidth). Rail edges are added for
every node pair of a cluster of at most ``DENSE_NODES`` nodes and, above that, only for pairs
whose link is not the cluster-wide default (a group or a pair override): a sparse graph that
still tells a partitioner where the fast links are, without the quadratic edge count of 8,192
GPUs.

**Stage units** (:func:`make_units`): the planner never splits a tensor-parallel (TP) group, so it
works on *units*: a TP group of ``tp`` consecutive GPUs of one node under a TP template (the TP
degree chosen for each node). A unit is a candidate stage. The unit graph contracts the device
graph over units; it is what METIS partitions into pipelines.

Units carry a ``signature`` (GPU type, TP degree, memory, slowdown, intra link): two units with
the same signature cost the same in every stage position, which is what lets the planner cache
per-pipeline results and group identical nodes on large clusters.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import networkx as nx

from planner.cluster import ClusterSpec, Link, Node

DENSE_NODES = 16


@dataclass(frozen=True)
class Unit:
    """A TP group on one node (or ``cp`` of them, a context-parallel mesh): a candidate stage."""

    index: int
    node: str
    devices: tuple[str, ...]
    gpu: str
    memory_gib: float  # the smallest device memory of the group (TP shards are equal)
    slowdown: float  # the largest slowdown of the group (TP runs at its slowest member)
    compute: float  # TFLOP/s of the whole group: tp * peak / slowdown
    link: Link  # the node's intra link (TP all-reduces and CP collectives run over it)
    cp: int = 1  # context-parallel slots: the devices are a cp x tp mesh (planner.plan.Stage)

    @property
    def tp(self) -> int:
        return len(self.devices) // self.cp

    @functools.cached_property
    def signature(self) -> tuple[object, ...]:  # cached: the search asks for it millions of times
        return (self.gpu, self.tp, self.memory_gib, self.slowdown, self.link, self.cp)


def device_compute(cluster: ClusterSpec, dev_id: str, dtype: str) -> float:
    """Peak TFLOP/s of one device for ``dtype``, divided by its slowdown."""
    dev = cluster.device(dev_id)
    return cluster.catalog.get(dev.gpu).peak(dtype) / dev.slowdown


def _rail_pairs(cluster: ClusterSpec) -> list[tuple[Node, Node, Link]]:
    nodes = list(cluster.nodes)
    pairs: list[tuple[Node, Node, Link]] = []
    if len(nodes) <= DENSE_NODES:
        for i, a in enumerate(nodes):
            for b in nodes[i + 1:]:
                pairs.append((a, b, cluster.node_link(a.name, b.name)))
        return pairs
    by_name = {n.name: n for n in nodes}
    seen: set[tuple[str, str]] = set()
    for group in cluster.groups:
        members = [by_name[n] for n in group.nodes]
        for i, a in enumerate(members):
            for b in members[i + 1:]:
                key = (min(a.name, b.name), max(a.name, b.name))
                if key not in seen:
                    seen.add(key)
                    pairs.append((a, b, cluster.node_link(a.name, b.name)))
    for x, y, _ in cluster.pair_links:
        key = (min(x, y), max(x, y))
        if key not in seen:
            seen.add(key)
            pairs.append((by_name[x], by_name[y], cluster.node_link(x, y)))
    return pairs


def device_graph(cluster: ClusterSpec, dtype: str = "bf16") -> nx.Graph:
    """The device graph described in the module docstring."""
    g = nx.Graph()
    for dev in cluster.devices:
        g.add_node(dev.id, compute=device_compute(cluster, dev.id, dtype), memory_gib=dev.memory_gib,
                   node=dev.node, gpu=dev.gpu)
    for node in cluster.nodes:
        ids = [f"{node.name}:{i}" for i in range(node.gpus)]
        for i, a in enumerate(ids):
            for b in ids[i + 1:]:
                g.add_edge(a, b, bandwidth=node.intra_link.bandwidth_GBps)
    for na, nb, link in _rail_pairs(cluster):
        for i in range(min(na.gpus, nb.gpus)):
            g.add_edge(f"{na.name}:{i}", f"{nb.name}:{i}", bandwidth=link.bandwidth_GBps)
    return g


def make_units(cluster: ClusterSpec, tp_of_node: Mapping[str, int | Sequence[int]], dtype: str = "bf16",
               cp: int = 1) -> list[Unit]:
    """Cut every node into TP groups of consecutive GPUs (in node order).

    ``tp_of_node[node]`` is one TP degree (every group of the node) or a list of group sizes
    (used by the enumerator: e.g. ``[4, 2, 2]``). With one degree that does not divide the node's
    GPU count, the remainder becomes smaller groups of the largest power of two that fits.
    ``cp > 1``: with one degree, each node is first cut into ``cp x tp`` meshes (CP units) while
    they fit; the rest of the node into TP groups as above."""
    units: list[Unit] = []
    for node in cluster.nodes:
        spec = tp_of_node[node.name]
        start = 0
        if not isinstance(spec, int):
            for size in spec:
                devs = tuple(f"{node.name}:{i}" for i in range(start, start + size))
                units.append(_unit(cluster, len(units), node.name, devs, dtype))
                start += size
            continue
        while cp > 1 and start + spec * cp <= node.gpus:
            devs = tuple(f"{node.name}:{i}" for i in range(start, start + spec * cp))
            units.append(_unit(cluster, len(units), node.name, devs, dtype, cp))
            start += spec * cp
        while start < node.gpus:
            size = spec
            while start + size > node.gpus:
                size //= 2
            devs = tuple(f"{node.name}:{i}" for i in range(start, start + size))
            units.append(_unit(cluster, len(units), node.name, devs, dtype))
            start += size
    return units


def unit_graph(cluster: ClusterSpec, units: list[Unit]) -> nx.Graph:
    """The device graph contracted over units: vertex weights compute and memory (whole group),
    edge weight = bandwidth of the link between the two units' nodes."""
    g = nx.Graph()
    by_node: dict[str, list[int]] = {}
    for u in units:
        g.add_node(u.index, compute=u.compute, memory_gib=u.memory_gib * len(u.devices))
        by_node.setdefault(u.node, []).append(u.index)
    for node in cluster.nodes:
        members = by_node.get(node.name, [])
        for i, a in enumerate(members):
            for b in members[i + 1:]:
                g.add_edge(a, b, bandwidth=node.intra_link.bandwidth_GBps)
    for na, nb, link in _rail_pairs(cluster):
        for ua in by_node.get(na.name, []):
            for ub in by_node.get(nb.name, []):
                g.add_edge(ua, ub, bandwidth=link.bandwidth_GBps)
    return g


def slowest_link_among(cluster: ClusterSpec, nodes: frozenset[str] | set[str]) -> Link | None:
    """The slowest link between any two of ``nodes`` (the intra link for one node, None for none).

    Linear in the number of nodes and groups: the default inter-node link applies unless one
    group holds them all; group links of groups holding two or more of them and pair overrides
    between two of them are the other candidates."""
    if not nodes:
        return None
    if len(nodes) == 1:
        return cluster.node(next(iter(nodes))).intra_link
    candidates: list[Link] = []
    inside_one = False
    for g in cluster.groups:
        members = nodes.intersection(g.nodes)
        if len(members) >= 2:
            candidates.append(g.link)
            if len(members) == len(nodes):
                inside_one = True
    if inside_one:
        # the smallest group holding all of them decides the default; other (smaller) groups only
        # matter for pairs inside them, whose link is that group's, already a candidate
        holders = [g for g in cluster.groups if nodes.issubset(g.nodes)]
        smallest = min(holders, key=lambda g: len(g.nodes))
        candidates = [g.link for g in cluster.groups
                      if len(nodes.intersection(g.nodes)) >= 2 and set(g.nodes).issubset(smallest.nodes)]
    else:
        candidates.append(cluster.inter_node)
    for a, b, link in cluster.pair_links:
        if a in nodes and b in nodes:
            candidates.append(link)
    return min(candidates, key=lambda lk: (lk.bandwidth_GBps, -lk.latency_us))


def split_unit(cluster: ClusterSpec, unit: Unit, next_index: int) -> tuple[Unit, Unit]:
    """A TP-``t`` unit as two TP-``t/2`` units of the same node (its lower and upper half)."""
    half = len(unit.devices) // 2
    a, b = unit.devices[:half], unit.devices[half:]
    return _unit(cluster, next_index, unit.node, a), _unit(cluster, next_index + 1, unit.node, b)


def merge_units(cluster: ClusterSpec, a: Unit, b: Unit, index: int) -> Unit:
    """Two units of one node as one TP group (devices in node order)."""
    devs = tuple(sorted(a.devices + b.devices, key=lambda d: cluster.device(d).local_index))
    return _unit(cluster, index, a.node, devs)


def _unit(cluster: ClusterSpec, index: int, node_name: str, devs: tuple[str, ...], dtype: str = "bf16",
          cp: int = 1) -> Unit:
    node = cluster.node(node_name)
    specs = [cluster.device(d) for d in devs]
    slow = max(d.slowdown for d in specs)
    peak = cluster.catalog.get(node.gpu).peak(dtype)
    return Unit(index, node_name, devs, node.gpu, min(d.memory_gib for d in specs), slow,
                len(devs) * peak / slow, node.intra_link, cp)


@dataclass(frozen=True)
class FastCluster(ClusterSpec):
    """The same cluster, with ``node_link`` memoised and ``slowest_link`` linear in the number of
    nodes (via :func:`slowest_link_among`) instead of quadratic. Results are identical; the cost
    model asks for thousands of device groups' slowest links on large clusters, which is where the
    planner's final estimate spent most of its time."""

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "_memo", {})

    def node_link(self, a: str, b: str) -> Link:
        memo: dict[tuple[str, str], Link] = self._memo  # type: ignore[attr-defined]
        hit = memo.get((a, b))
        if hit is None:
            hit = memo[a, b] = memo[b, a] = ClusterSpec.node_link(self, a, b)
        return hit

    def slowest_link(self, dev_ids: list[str] | tuple[str, ...]) -> Link | None:
        if len(dev_ids) < 2:
            return None
        count: dict[str, int] = {}
        for d in dev_ids:
            node = self.device(d).node
            count[node] = count.get(node, 0) + 1
        links = [self.node(n).intra_link for n, c in count.items() if c > 1]
        if len(count) > 1:
            between = slowest_link_among(self, frozenset(count))
            if between is not None:
                links.append(between)
        return min(links, key=lambda lk: (lk.bandwidth_GBps, -lk.latency_us))


def fast_cluster(cluster: ClusterSpec) -> ClusterSpec:
    """``cluster`` as a :class:`FastCluster` (for the cost model's whole-plan estimate)."""
    if isinstance(cluster, FastCluster):
        return cluster
    return FastCluster(name=cluster.name, nodes=cluster.nodes, inter_node=cluster.inter_node, groups=cluster.groups,
                       pair_links=cluster.pair_links, overrides=cluster.overrides, catalog=cluster.catalog)

"""Communication times from link profiles: p2p, broadcast, ring/tree all-reduce, reduce-scatter,
all-gather, and the hierarchical (intra-node then inter-node) all-reduce.

Every link is ``time = latency + bytes / bandwidth`` with the effective bandwidth
``bw = link.bandwidth_GBps · 1e9 · link_efficiency`` (``CostParams``). A collective over a group
runs at the pace of the slowest link the group crosses (``ClusterSpec.slowest_link``). For ``n``
ranks and a message of ``B`` bytes (``α`` latency, ``bw`` bandwidth)::

    p2p             α + B/bw
    broadcast       (n-1)·α + B/bw                    pipelined chain
    reduce-scatter  (n-1)·α + (n-1)/n · B/bw          ring (all-gather: the same)
    ring all-reduce 2(n-1)·α + 2(n-1)/n · B/bw
    tree all-reduce 2·ceil(log2 n)·α + 2·B/bw         pipelined reduce + broadcast on a binary tree
    "best"          min(ring, tree)                   what NCCL's tuner approximates

Hierarchical all-reduce of a group spanning ``k`` nodes with up to ``g`` group members per node:
intra-node reduce-scatter of ``B`` over ``g`` ranks, ``g`` concurrent inter-node all-reduces of
``B/g`` over ``k`` ranks, intra-node all-gather; it is used when faster than the flat one.

Assumption (documented in the cluster format too): a link's bandwidth is per device pair, so
concurrent transfers between *different* device pairs do not share it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from planner.cluster import ClusterSpec, Link
from planner.cost.params import DEFAULT_PARAMS, CostParams


def _bw(link: Link, params: CostParams) -> float:
    return link.bandwidth_GBps * 1e9 * params.link_efficiency


def p2p_time(nbytes: float, link: Link, params: CostParams = DEFAULT_PARAMS) -> float:
    """One point-to-point message."""
    if nbytes <= 0:
        return 0.0
    return link.latency_us * 1e-6 + nbytes / _bw(link, params)


def broadcast_time(nbytes: float, n: int, link: Link | None, params: CostParams = DEFAULT_PARAMS) -> float:
    """Pipelined chain broadcast from one rank to the other ``n - 1``."""
    if n <= 1 or nbytes <= 0 or link is None:
        return 0.0
    return (n - 1) * link.latency_us * 1e-6 + nbytes / _bw(link, params)


def reduce_scatter_time(nbytes: float, n: int, link: Link | None, params: CostParams = DEFAULT_PARAMS) -> float:
    """Ring reduce-scatter of ``nbytes`` (the full buffer) over ``n`` ranks; all-gather costs the same."""
    if n <= 1 or nbytes <= 0 or link is None:
        return 0.0
    return (n - 1) * link.latency_us * 1e-6 + (n - 1) / n * nbytes / _bw(link, params)


all_gather_time = reduce_scatter_time


def ring_allreduce_time(nbytes: float, n: int, link: Link | None, params: CostParams = DEFAULT_PARAMS) -> float:
    return 2.0 * reduce_scatter_time(nbytes, n, link, params)


def tree_allreduce_time(nbytes: float, n: int, link: Link | None, params: CostParams = DEFAULT_PARAMS) -> float:
    if n <= 1 or nbytes <= 0 or link is None:
        return 0.0
    return 2 * math.ceil(math.log2(n)) * link.latency_us * 1e-6 + 2.0 * nbytes / _bw(link, params)


def allreduce_time(nbytes: float, n: int, link: Link | None, params: CostParams = DEFAULT_PARAMS) -> float:
    """Flat all-reduce over ``n`` ranks whose slowest link is ``link``, by ``params.allreduce_algo``."""
    if params.allreduce_algo == "ring":
        return ring_allreduce_time(nbytes, n, link, params)
    if params.allreduce_algo == "tree":
        return tree_allreduce_time(nbytes, n, link, params)
    return min(ring_allreduce_time(nbytes, n, link, params), tree_allreduce_time(nbytes, n, link, params))


def hierarchical_allreduce_time(nbytes: float, per_node: int, nodes: int, intra: Link | None, inter: Link | None,
                                params: CostParams = DEFAULT_PARAMS) -> float:
    """Intra-node reduce-scatter, inter-node all-reduce of each shard, intra-node all-gather."""
    if per_node <= 1:
        return allreduce_time(nbytes, nodes, inter, params)
    return (2.0 * reduce_scatter_time(nbytes, per_node, intra, params)
            + allreduce_time(nbytes / per_node, nodes, inter, params))


def group_allreduce_time(nbytes: float, devices: Sequence[str], cluster: ClusterSpec,
                         params: CostParams = DEFAULT_PARAMS) -> float:
    """All-reduce among ``devices`` of ``cluster``: flat over the slowest link the group crosses,
    or hierarchical when the group spans several nodes and that is faster."""
    n = len(devices)
    if n <= 1 or nbytes <= 0:
        return 0.0
    flat = allreduce_time(nbytes, n, cluster.slowest_link(list(devices)), params)
    if not params.hierarchical_allreduce:
        return flat
    by_node: dict[str, list[str]] = {}
    for d in devices:
        by_node.setdefault(cluster.device(d).node, []).append(d)
    if len(by_node) == 1 or len(by_node) == n:
        return flat
    per_node = max(len(v) for v in by_node.values())
    multi = [v for v in by_node.values() if len(v) > 1]
    intra = min((cluster.slowest_link(v) for v in multi), key=lambda lk: lk.bandwidth_GBps)  # type: ignore[union-attr]
    leaders = [v[0] for v in by_node.values()]
    inter = cluster.slowest_link(leaders)
    return min(flat, hierarchical_allreduce_time(nbytes, per_node, len(by_node), intra, inter, params))


def group_broadcast_time(nbytes: float, devices: Sequence[str], cluster: ClusterSpec,
                         params: CostParams = DEFAULT_PARAMS) -> float:
    """Broadcast from ``devices[0]`` to the rest over the slowest link of the group."""
    return broadcast_time(nbytes, len(devices), cluster.slowest_link(list(devices)), params)

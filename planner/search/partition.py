"""Phase 1: split the stage units into pipelines (data-parallel replicas).

Two deterministic partitioners, both tried by the planner:

* :func:`metis_pipelines` — a METIS k-way partition of the unit graph (pymetis) with two balance
  constraints per vertex, compute (TFLOP/s) and memory (GiB) (or compute alone: where the fast
  GPUs also hold the most memory the two constraints cannot both be met and METIS's
  multi-constraint result is badly unbalanced, so the planner tries both), and edge weights
  proportional to link bandwidth, so the cut (the links between pipelines) falls on the slow links and each pipeline's
  stage-to-stage traffic stays on fast ones. METIS runs with a fixed seed, so the result is a
  function of the inputs and ``seed`` only.
* the hierarchical partition used for large clusters: :func:`unit_classes` groups the units into
  *classes* of interchangeable units (same signature, same node group), and the planner cuts each
  class into pipelines of consecutive units (:func:`chunk`). Identical pipelines then cost the
  same, so the planner evaluates one pipeline per (class, size) instead of one per pipeline.

Pipelines are lists of unit indices; their stage order is phase 2's job (:mod:`.stages`).
"""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx
import pymetis

from planner.cluster import ClusterSpec
from planner.search.c_output import stdout_to_stderr
from planner.search.graph import Unit

EDGE_SCALE = 10  # METIS edge weights are integers: bandwidth in units of 0.1 GB/s
VERTEX_SCALE = 1000


class MetisGraph:
    """The unit graph in METIS's CSR form (built once, partitioned for many ``k``)."""

    def __init__(self, graph: nx.Graph):
        self.order = sorted(graph.nodes)
        pos = {u: i for i, u in enumerate(self.order)}
        max_c = max((graph.nodes[u]["compute"] for u in self.order), default=1.0) or 1.0
        max_m = max((graph.nodes[u]["memory_gib"] for u in self.order), default=1.0) or 1.0
        self.xadj = [0]
        self.adjncy: list[int] = []
        self.eweights: list[int] = []
        self.vweights: list[int] = []
        for u in self.order:
            for v in sorted(graph.adj[u], key=pos.__getitem__):
                self.adjncy.append(pos[v])
                self.eweights.append(max(1, round(graph.adj[u][v]["bandwidth"] * EDGE_SCALE)))
            self.xadj.append(len(self.adjncy))
            self.vweights.append(max(1, round(graph.nodes[u]["compute"] / max_c * VERTEX_SCALE)))
            self.vweights.append(max(1, round(graph.nodes[u]["memory_gib"] / max_m * VERTEX_SCALE)))

    def part(self, k: int, seed: int = 0, memory: bool = True) -> list[list[int]]:
        """k-way partition; empty parts dropped; parts sorted by their first unit. ``memory=False``
        balances compute only (one constraint balances much better when the types with the most
        compute also have the most memory, as METIS's multi-constraint balance then fails)."""
        n = len(self.order)
        if k <= 1 or n <= 1:
            return [list(self.order)]
        if k >= n:
            return [[u] for u in self.order]
        opts = pymetis.Options(seed=seed)
        csr = pymetis.CSRAdjacency(self.xadj, self.adjncy)
        vweights = self.vweights if memory else self.vweights[0::2]
        with stdout_to_stderr():  # METIS prints its complaints on stdout (:mod:`.c_output`)
            _, parts = pymetis.part_graph(k, csr, vweights=vweights, eweights=self.eweights or None, options=opts)
        groups: dict[int, list[int]] = {}
        for u, p in zip(self.order, parts):
            groups.setdefault(p, []).append(u)
        return sorted(groups.values(), key=lambda g: g[0])


def metis_pipelines(graph: nx.Graph, k: int, seed: int = 0, memory: bool = True) -> list[list[int]]:
    """k-way METIS partition of a unit (or device) graph with ``compute``/``memory_gib`` vertex
    weights and ``bandwidth`` edge weights; empty parts dropped; parts sorted by first vertex."""
    return MetisGraph(graph).part(k, seed, memory)


def unit_classes(cluster: ClusterSpec, units: Sequence[Unit]) -> list[list[int]]:
    """Units grouped into classes of interchangeable ones (signature + smallest node group).

    Classes come in order of their first unit; members keep node order."""
    group_of: dict[str, str] = {}
    for g in sorted(cluster.groups, key=lambda g: -len(g.nodes)):
        for n in g.nodes:
            group_of[n] = g.name  # the smallest group wins (it is assigned last)
    classes: dict[tuple[object, ...], list[int]] = {}
    for u in units:
        key = (*u.signature, group_of.get(u.node, ""), cluster.node(u.node).gpus)
        classes.setdefault(key, []).append(u.index)
    return list(classes.values())


def chunk(members: Sequence[int], size: int) -> list[list[int]]:
    """Consecutive chunks of ``size`` units; a short tail joins the previous chunk."""
    size = max(1, size)
    out = [list(members[i:i + size]) for i in range(0, len(members), size)]
    if len(out) > 1 and len(out[-1]) < size:
        out[-2].extend(out.pop())
    return out

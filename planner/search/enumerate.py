"""Exhaustive enumeration of the planner's plan space, for small clusters (<= 16 GPUs).

The space (the one :mod:`.planner` searches heuristically):

* every way to cut each node into TP groups (a multiset of allowed TP degrees summing to the
  node's GPU count, :func:`node_cuts`; the local search's TP split/merge reaches all of them).
  GPUs of a node are interchangeable unless the cluster overrides some of them; for such nodes
  every arrangement of the groups along the node is enumerated;
* every partition of the resulting stage units into pipelines. Units of one node with one TP
  signature are interchangeable (same device type, memory, slowdown, links), so a partition is a
  *multiset partition* of the per-(node, signature) unit counts (:func:`vector_partitions`),
  each generated once;
* stages in the phase-2 order (:func:`planner.search.stages.order_stages`);
* every setting: micro-batch size, recompute, ZeRO, schedule (``PlannerConfig``);
* for each of those, the exact layer split and batch split (:mod:`.layer_split` and
  :mod:`.batch_split`: the layer split is exact and the batch split is the ILP's min-max), so no
  layer or batch split needs enumerating.

Every point is scored with the planner's surrogate; the best ``finalists`` by surrogate are then
scored with the full :func:`planner.cost.estimate` and the fastest that fits is the optimum.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from planner.cluster import ClusterSpec
from planner.cost import ProfileSet
from planner.errors import SpecError
from planner.model import ModelSpec
from planner.search.candidate import Candidate
from planner.search.graph import Unit, make_units
from planner.search.planner import PlannerConfig, Search, SearchResult
from planner.search.stages import order_units, tp_choices

MAX_DEVICES = 16


def vector_partitions(counts: Sequence[int], bound: tuple[int, ...] | None = None) -> Iterator[list[tuple[int, ...]]]:
    """Every multiset partition of a multiset given by its ``counts`` vector, once each: lists of
    part vectors in non-increasing lexicographic order (``bound`` caps the first part)."""
    if not any(counts):
        yield []
        return
    for part in itertools.product(*(range(c, -1, -1) for c in counts)):
        if not any(part):
            continue
        if bound is not None and part > bound:
            continue
        rest = tuple(c - p for c, p in zip(counts, part))
        for tail in vector_partitions(rest, part):
            yield [part, *tail]


def node_cuts(gpus: int, choices: Sequence[int]) -> list[list[int]]:
    """Multisets (descending lists) of allowed TP degrees summing to ``gpus``."""
    out: list[list[int]] = []

    def rec(left: int, cap: int, acc: list[int]) -> None:
        if left == 0:
            out.append(list(acc))
            return
        for t in sorted(choices, reverse=True):
            if t <= cap and t <= left:
                acc.append(t)
                rec(left - t, t, acc)
                acc.pop()

    rec(gpus, max(choices), [])
    return out


@dataclass
class EnumerationResult:
    best: SearchResult
    points: int  # (structure, setting) pairs scored
    structures: int
    elapsed_s: float


def enumerate_plans(cluster: ClusterSpec, model: ModelSpec, global_batch: int, *,
                    config: PlannerConfig | None = None, profiles: ProfileSet | None = None,
                    finalists: int = 12) -> EnumerationResult:
    """The optimum of the plan space above (module docstring)."""
    if cluster.num_devices > MAX_DEVICES:
        raise SpecError("cluster", f"{cluster.num_devices} devices: the enumerator handles at most {MAX_DEVICES}",
                        "use the planner for larger clusters")
    base = config or PlannerConfig()
    cfg = replace(base, max_evaluations=1 << 62, time_limit_s=1e9, local_search=False, finalists=finalists)
    search = Search(cluster, model, global_batch, cfg, profiles)
    start = time.perf_counter()
    settings = search.all_settings()
    L = model.num_layers
    heap: list[tuple[float, int, Candidate]] = []
    structures = 0
    overridden = {dev.split(":")[0] for dev, _ in cluster.overrides}
    per_node: list[list[list[int]]] = []
    for n in cluster.nodes:
        cuts = node_cuts(n.gpus, tp_choices(model, n.gpus))
        if n.name in overridden:  # GPUs differ: where each group sits matters
            cuts = [list(p) for c in cuts for p in sorted(set(itertools.permutations(c)), reverse=True)]
        per_node.append(cuts)
    for combo in itertools.product(*per_node):
        template = {n.name: c for n, c in zip(cluster.nodes, combo)}
        units = make_units(cluster, template, cfg.dtype)
        groups: dict[tuple[object, ...], list[Unit]] = {}
        for u in units:
            groups.setdefault((u.node, *u.signature), []).append(u)
        members = list(groups.values())
        for parts in vector_partitions([len(m) for m in members]):
            used = [0] * len(members)
            pipes: list[list[Unit]] = []
            for part in parts:
                chosen: list[int] = []
                for j, c in enumerate(part):
                    chosen += [u.index for u in members[j][used[j]:used[j] + c]]
                    used[j] += c
                pipes.append(order_units(cluster, [units[i] for i in chosen]))
            if any(len(p) > L for p in pipes):
                continue
            structures += 1
            for s in settings:
                cand = search.evaluate(pipes, s)
                if cand.feasible:
                    item = (-cand.step_s, search.evaluations, cand)
                    if len(heap) < 4 * finalists:
                        heapq.heappush(heap, item)
                    elif item > heap[0]:
                        heapq.heapreplace(heap, item)
    if not heap:
        raise search.infeasible()
    pool = [c for _, _, c in heap]
    best = search.finish(pool)
    return EnumerationResult(best, search.evaluations, structures, time.perf_counter() - start)


__all__ = ["EnumerationResult", "enumerate_plans", "node_cuts", "vector_partitions"]

"""Phase 2: stages inside a pipeline, TP templates, and the device order of the final plan.

* **TP degrees** (:func:`tp_choices`): a stage's TP degree is a power of two that divides the
  head count, the KV-head count, the FFN width and the vocabulary (every first/last stage holds a
  vocab-parallel embedding/head), and fits in one node: TP groups never cross a node, because the
  link between nodes is the slow one (the cost model would also charge TP all-reduces there).
* **TP templates** (:func:`tp_templates`): one TP degree per node *kind* (GPU type and GPU count);
  the planner searches templates, the local search changes single stages afterwards.
* **Stage order** (:func:`order_units`): stages of a pipeline are sorted by (memory per device,
  descending; node group; node position; TP degree; first GPU). Keeping a node's units together makes
  consecutive stages share the intra-node link, keeping a group's nodes together keeps the hops
  between nodes on the group's (fast) link, and putting the devices with the most memory first
  matches 1F1B, where stage ``i`` of ``S`` keeps ``S - i`` micro-batches of activations alive.
* **Seed numbering** (:func:`seed_numbering`): the seed's ``--devices_id`` hands out each node's
  GPUs in ascending order of rank. GPUs of one node are interchangeable when they carry the same
  overrides, so the device ids are relabelled, per node and override, to ascending order of
  first use.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.cluster import ClusterSpec
from planner.model import ModelSpec
from planner.plan import Pipeline, Plan, Stage
from planner.search.graph import Unit


def tp_choices(model: ModelSpec, max_tp: int) -> list[int]:
    """Powers of two up to ``max_tp`` that divide heads, KV heads, FFN width and vocabulary."""
    out = []
    t = 1
    while t <= max_tp:
        if all(v % t == 0 for v in (model.num_heads, model.num_kv_heads, model.ffn_hidden_size, model.vocab_size)):
            out.append(t)
        t *= 2
    return out


def node_kinds(cluster: ClusterSpec) -> dict[tuple[str, int], list[str]]:
    """Nodes grouped by (GPU type, GPU count), in cluster order."""
    kinds: dict[tuple[str, int], list[str]] = {}
    for n in cluster.nodes:
        kinds.setdefault((n.gpu, n.gpus), []).append(n.name)
    return kinds


def tp_templates(cluster: ClusterSpec, model: ModelSpec, uniform_only: bool = False) -> list[dict[str, int]]:
    """TP degree per node: every uniform degree (capped per node) and, unless ``uniform_only``,
    the per-kind variations of each uniform one (one kind changed at a time). Deterministic order."""
    kinds = node_kinds(cluster)
    choices = {k: tp_choices(model, k[1]) for k in kinds}
    top = max(max(c) for c in choices.values())
    seen: list[tuple[int, ...]] = []
    out: list[dict[str, int]] = []

    def add(per_kind: dict[tuple[str, int], int]) -> None:
        key = tuple(per_kind[k] for k in kinds)
        if key not in seen:
            seen.append(key)
            out.append({n: per_kind[k] for k, names in kinds.items() for n in names})

    uniform = []
    t = 1
    while t <= top:
        per_kind = {k: max(c for c in choices[k] if c <= t) for k in kinds}
        uniform.append(per_kind)
        add(per_kind)
        t *= 2
    if not uniform_only:
        for base in uniform:
            for k in kinds:
                for c in choices[k]:
                    if c != base[k]:
                        add({**base, k: c})
    return out


def order_stages(cluster: ClusterSpec, units: Sequence[Unit], members: Sequence[int]) -> list[int]:
    """The stage order of one pipeline given as unit indices (module docstring)."""
    by_index = {units[i].index: i for i in members}
    return [by_index[u.index] for u in order_units(cluster, [units[i] for i in members])]


def order_units(cluster: ClusterSpec, pipeline: Sequence[Unit]) -> list[Unit]:
    """The stage order of one pipeline (module docstring): memory per device descending, then node
    group, node position, TP degree and first GPU. Inside a node the order depends only on the
    groups' sizes (and memory), not on which GPUs form them."""
    pos, group_of = _node_keys(cluster)
    return sorted(pipeline, key=lambda u: (-u.memory_gib, group_of.get(u.node, -1), pos[u.node], u.tp,
                                           cluster.device(u.devices[0]).local_index))


_NODE_KEYS: dict[int, tuple[ClusterSpec, dict[str, int], dict[str, int]]] = {}


def _node_keys(cluster: ClusterSpec) -> tuple[dict[str, int], dict[str, int]]:
    """Node position and smallest-group index per node name (cached per cluster object)."""
    hit = _NODE_KEYS.get(id(cluster))
    if hit is None or hit[0] is not cluster:
        pos = {n.name: i for i, n in enumerate(cluster.nodes)}
        group_of: dict[str, int] = {}
        for gi, g in sorted(enumerate(cluster.groups), key=lambda x: -len(x[1].nodes)):
            for n in g.nodes:
                group_of[n] = gi
        if len(_NODE_KEYS) > 64:
            _NODE_KEYS.clear()
        hit = _NODE_KEYS[id(cluster)] = (cluster, pos, group_of)
    return hit[1], hit[2]


def seed_numbering(plan: Plan, cluster: ClusterSpec) -> Plan:
    """Relabel interchangeable GPUs so each node's GPUs appear in ascending order of rank.

    GPUs of one node with the same memory and slowdown are interchangeable; within each such set
    the first one used (in rank order) gets the lowest index. Where a node's overridden GPUs sit
    out of order the seed numbering cannot express the plan (``plan_to_flags`` says so)."""
    used: dict[tuple[str, float, float], list[str]] = {}
    for dev in plan.devices:
        d = cluster.device(dev)
        used.setdefault((d.node, d.memory_gib, d.slowdown), []).append(dev)
    rename: dict[str, str] = {}
    for devs in used.values():
        ordered = sorted(devs, key=lambda x: cluster.device(x).local_index)
        rename.update(zip(devs, ordered))
    if all(k == v for k, v in rename.items()):
        return plan
    pipes = tuple(
        Pipeline(p.batch_size, p.micro_batches,
                 tuple(Stage(tuple(rename.get(d, d) for d in s.devices), s.tp, s.layers, s.cp, s.chunks)
                       for s in p.stages),
                 p.schedule)
        for p in plan.pipelines)
    return Plan(plan.model, plan.global_batch_size, pipes, plan.options, plan.cluster, plan.estimate)

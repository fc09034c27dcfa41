"""Device graph, units, METIS pipelines, stage order, TP templates, multiset partitions."""

from __future__ import annotations

from pathlib import Path

from planner.cluster import load_cluster, parse_cluster
from planner.model import PRESETS
from planner.plan import Pipeline, Plan, Stage
from planner.search.enumerate import node_cuts, vector_partitions
from planner.search.graph import device_graph, make_units, slowest_link_among, unit_graph
from planner.search.partition import metis_pipelines, unit_classes
from planner.search.stages import order_units, seed_numbering, tp_choices, tp_templates
from planner.seed_flags import plan_to_flags

ROOT = Path(__file__).resolve().parents[2]
UNEVEN = ROOT / "examples" / "clusters" / "seed-uneven-nodes.yaml"
SEED32 = ROOT / "examples" / "clusters" / "seed-32gpu-4types.yaml"


def test_device_graph_weights_and_edges() -> None:
    cluster = load_cluster(SEED32)
    g = device_graph(cluster)
    assert g.number_of_nodes() == 32
    assert g.nodes["a100:0"]["compute"] > g.nodes["r3080ti:0"]["compute"]
    assert g.nodes["a100:0"]["memory_gib"] == 80
    assert g.edges["a100:0", "a100:7"]["bandwidth"] == 300  # NVLink inside the node
    assert g.edges["a100:0", "r4090:0"]["bandwidth"] == 12.5  # rail edge between nodes


def test_units_follow_the_template() -> None:
    cluster = load_cluster(SEED32)
    units = make_units(cluster, {n.name: 4 if n.gpu == "a100-sxm-80g" else 1 for n in cluster.nodes})
    assert len(units) == 2 + 24
    a100 = [u for u in units if u.gpu == "a100-sxm-80g"]
    assert [u.devices for u in a100] == [tuple(f"a100:{i}" for i in range(4)), tuple(f"a100:{i}" for i in range(4, 8))]
    assert a100[0].compute == 4 * cluster.catalog.get("a100-sxm-80g").peak("bf16")
    mixed = make_units(cluster, {n.name: [4, 2, 1, 1] for n in cluster.nodes})
    assert [u.tp for u in mixed[:4]] == [4, 2, 1, 1]


def test_metis_is_deterministic_and_keeps_nodes_together() -> None:
    cluster = load_cluster(ROOT / "examples" / "clusters" / "a100-pcie-4x8-tcp.yaml")
    units = make_units(cluster, {n.name: 1 for n in cluster.nodes})
    g = unit_graph(cluster, units)
    parts = metis_pipelines(g, 4, seed=0)
    assert parts == metis_pipelines(g, 4, seed=0)
    assert sorted(u for p in parts for u in p) == list(range(32))
    for p in parts:  # 4 balanced parts of 8 GPUs: the cheapest cut (slow links only) keeps nodes whole
        assert len({units[u].node for u in p}) == 1
    mixed = load_cluster(SEED32)
    munits = make_units(mixed, {n.name: 1 for n in mixed.nodes})
    mparts = metis_pipelines(unit_graph(mixed, munits), 4, seed=0, memory=False)
    compute = [sum(munits[u].compute for u in p) for p in mparts]
    assert max(compute) < 1.6 * min(compute)  # balanced compute, even across GPU types


def test_slowest_link_among_groups() -> None:
    cluster = load_cluster(UNEVEN)
    assert slowest_link_among(cluster, frozenset({"r4090-0", "r4090-1"})).bandwidth_GBps == 12.5
    assert slowest_link_among(cluster, frozenset({"r4090-0", "a100"})).bandwidth_GBps == 3.125
    assert slowest_link_among(cluster, frozenset({"a100"})).bandwidth_GBps == 300


def test_classes_split_by_group_and_node_size() -> None:
    cluster = load_cluster(UNEVEN)
    units = make_units(cluster, {n.name: 4 for n in cluster.nodes})
    sizes = sorted(len(c) for c in unit_classes(cluster, units))
    assert sizes == [2, 2, 2, 8]  # 3090 node, a100 node, the two 4-GPU 4090 nodes, the four 8-GPU ones


def test_stage_order_puts_memory_first_and_is_label_free() -> None:
    cluster = load_cluster(SEED32)
    units = make_units(cluster, {n.name: 2 for n in cluster.nodes})
    pipeline = [units[0], units[4], units[8], units[12]]  # 3080ti, 3090, 4090, a100 (first units)
    ordered = order_units(cluster, pipeline)
    assert ordered[0].gpu == "a100-sxm-80g" and ordered[-1].gpu == "rtx3080ti"
    assert order_units(cluster, list(reversed(pipeline))) == ordered


def test_tp_choices_and_templates() -> None:
    model = PRESETS["llama2-7b"]
    assert tp_choices(model, 8) == [1, 2, 4, 8]
    assert tp_choices(PRESETS["llama-30b"], 8) == [1, 2, 4]  # 52 heads
    cluster = load_cluster(SEED32)
    templates = tp_templates(cluster, model)
    assert templates[0] == {n.name: 1 for n in cluster.nodes}
    assert len({tuple(sorted(t.items())) for t in templates}) == len(templates)


def test_vector_partitions_counts() -> None:
    # set partitions of 3 distinct items (Bell number), integer partitions of 4, {a,a,b,b}
    assert sum(1 for _ in vector_partitions([1, 1, 1])) == 5
    assert sum(1 for _ in vector_partitions([4])) == 5
    assert sum(1 for _ in vector_partitions([2, 2])) == 9
    parts = list(vector_partitions([2, 1]))
    assert len({tuple(sorted(p)) for p in parts}) == len(parts) == 4
    assert sorted(map(sorted, node_cuts(4, [1, 2, 4]))) == [[1, 1, 1, 1], [1, 1, 2], [2, 2], [4]]


def test_seed_numbering_makes_flags_expressible() -> None:
    cluster = parse_cluster({"name": "c", "nodes": [{"name": "n", "gpu": "rtx4090", "gpus": 4,
                                                     "intra_link": {"bandwidth_GBps": 20}}],
                             "inter_node": {"bandwidth_GBps": 1}})
    model = PRESETS["tiny"]
    plan = Plan(model, 4, (Pipeline(2, 2, (Stage(("n:2", "n:3"), 2, (0, 4)),)),
                           Pipeline(2, 2, (Stage(("n:0",), 1, (0, 2)), Stage(("n:1",), 1, (2, 4))))))
    fixed = seed_numbering(plan, cluster)
    assert fixed.devices == ["n:0", "n:1", "n:2", "n:3"]
    assert plan_to_flags(fixed, cluster).devices_id == [[[0, 0]], [[0], [0]]]


def test_fast_cluster_gives_the_same_links() -> None:
    import random

    from planner.search.graph import fast_cluster

    for path in sorted((ROOT / "examples" / "clusters").glob("*.yaml")):
        cluster = load_cluster(path)
        fast = fast_cluster(cluster)
        ids = [d.id for d in cluster.devices]
        rng = random.Random(path.name)
        for _ in range(200):
            group = rng.sample(ids, rng.randint(1, min(12, len(ids))))
            assert fast.slowest_link(group) == cluster.slowest_link(group), (path.name, group)
            a, b = rng.sample([n.name for n in cluster.nodes], 2) if len(cluster.nodes) > 1 else (ids[0], ids[0])
            if len(cluster.nodes) > 1:
                assert fast.node_link(a, b) == cluster.node_link(a, b)

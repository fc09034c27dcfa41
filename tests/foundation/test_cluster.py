from __future__ import annotations

from pathlib import Path

import pytest

from planner.cluster import cluster_to_dict, load_cluster, parse_cluster
from planner.errors import SpecError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples" / "clusters").glob("*.yaml"))

LINK = {"kind": "pcie", "bandwidth_GBps": 16, "latency_us": 10}


def base() -> dict:
    return {
        "name": "t",
        "nodes": [
            {"name": "a", "gpu": "a100-sxm-80g", "gpus": 4, "intra_link": {"kind": "nvlink", "bandwidth_GBps": 300}},
            {"name": "b", "count": 2, "gpu": "rtx4090", "gpus": 2, "intra_link": dict(LINK)},
        ],
        "inter_node": {"kind": "ethernet", "bandwidth_GBps": 1.25, "latency_us": 50},
    }


def test_examples_load() -> None:
    assert len(EXAMPLES) >= 6
    sizes = {p.stem: load_cluster(p).num_devices for p in EXAMPLES}
    assert sizes["seed-40gpu-3types"] == 40
    assert sizes["seed-32gpu-4types"] == 32
    assert sizes["seed-uneven-nodes"] == 8 + 2 * 4 + 4 * 8 + 8
    assert sizes["a100-pcie-2x8-tcp"] == 16 and sizes["a100-pcie-4x8-tcp"] == 32
    assert sizes["h20-h800"] == 48


def test_compact_form_and_device_ids() -> None:
    c = parse_cluster(base())
    assert [n.name for n in c.nodes] == ["a", "b-0", "b-1"]
    assert [d.id for d in c.devices][:5] == ["a:0", "a:1", "a:2", "a:3", "b-0:0"]
    assert c.device("b-1:1").gpu == "rtx4090"
    assert c.device("a:0").memory_gib == 80


def test_link_resolution_order() -> None:
    data = base()
    data["groups"] = [{"name": "rack", "nodes": ["a", "b-0", "b-1"], "link": {"bandwidth_GBps": 10}},
                      {"name": "pair", "nodes": ["b-0", "b-1"], "link": {"bandwidth_GBps": 20}}]
    data["links"] = [{"between": ["a", "b-1"], "link": {"bandwidth_GBps": 5, "latency_us": 1}}]
    c = parse_cluster(data)
    assert c.link("a:0", "a:1").bandwidth_GBps == 300  # same node
    assert c.link("a:0", "b-1:0").bandwidth_GBps == 5  # pair override
    assert c.link("b-0:0", "b-1:0").bandwidth_GBps == 20  # smallest group
    assert c.link("a:0", "b-0:0").bandwidth_GBps == 10  # larger group
    del data["groups"]
    assert parse_cluster(data).link("a:0", "b-0:0").bandwidth_GBps == 1.25  # default
    assert parse_cluster(data).slowest_link(["a:0", "a:1", "b-0:0"]).bandwidth_GBps == 1.25


def test_device_overrides() -> None:
    data = base()
    data["devices"] = {"b-0:1": {"memory_gib": 12, "slowdown": 1.5}}
    d = parse_cluster(data).device("b-0:1")
    assert (d.memory_gib, d.slowdown) == (12, 1.5)


@pytest.mark.parametrize(
    "mutate, path, word",
    [
        (lambda d: d.update(extra=1), "extra", "unknown key"),
        (lambda d: d["nodes"][0].update(gpus=0), "nodes[0].gpus", ">= 1"),
        (lambda d: d["nodes"][0].update(gpu="rtx9999"), "nodes[0].gpu", "unknown GPU type"),
        (lambda d: d["nodes"][1]["intra_link"].update(bandwidth_GBps=-3), "nodes[1].intra_link.bandwidth_GBps", "> 0"),
        (lambda d: d["nodes"][1]["intra_link"].update(bandwidth_GBps=0), "nodes[1].intra_link.bandwidth_GBps", "> 0"),
        (lambda d: d["inter_node"].update(kind="carrier-pigeon"), "inter_node.kind", "not one of"),
        (lambda d: d["nodes"].append(dict(d["nodes"][0])), "nodes", "duplicate node name"),
        (lambda d: d["nodes"][0].update(gpus="four"), "nodes[0].gpus", "integer"),
        (lambda d: d.update(devices={"zz:0": {"slowdown": 2}}), "devices.zz:0", "no device"),
        (lambda d: d.update(links=[{"between": ["a", "q"], "link": LINK}]), "links[0].between[1]", "unknown node"),
        (lambda d: d.update(links=[{"between": ["a", "b-0"], "link": LINK}, {"between": ["b-1", "a"], "link": LINK},
                                   {"between": ["b-0", "a"], "link": LINK}]), "links[2].between", "also links[0]"),
        (lambda d: d["nodes"][0].pop("intra_link"), "nodes[0].intra_link", "missing"),
        (lambda d: d["nodes"][0].update(intra_lnk=1), "nodes[0].intra_lnk", "did you mean 'intra_link'"),
    ],
)
def test_errors_name_the_field(mutate, path: str, word: str) -> None:
    data = base()
    mutate(data)
    with pytest.raises(SpecError) as info:
        parse_cluster(data)
    assert info.value.path == path
    assert word in str(info.value)
    assert info.value.hint


def test_file_errors_carry_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: [\n  {name: a\n")
    with pytest.raises(SpecError) as info:
        load_cluster(bad)
    assert str(bad) in str(info.value) and "line" in str(info.value)
    with pytest.raises(SpecError, match="cannot read"):
        load_cluster(tmp_path / "missing.yaml")


def test_round_trip_through_dict() -> None:
    for path in EXAMPLES:
        c = load_cluster(path)
        again = parse_cluster(cluster_to_dict(c))
        assert [d for d in again.devices] == [d for d in c.devices]
        assert again.inter_node == c.inter_node and again.groups == c.groups


def test_field_errors_carry_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "c.yaml"
    bad.write_text("name: x\nnodes:\n  - name: a\n    gpu: a100\n    gpus: 2\n"
                   "    intra_link: {kind: nvlink, bandwidth_GBps: -1}\n"
                   "inter_node: {bandwidth_GBps: 1}\n")
    with pytest.raises(SpecError) as info:
        load_cluster(bad)
    assert info.value.line == 6 and f"{bad}:6: nodes[0].intra_link.bandwidth_GBps" in str(info.value)
    bad.write_text("nodes:\n  - {name: a, gpu: a100, gpus: 2, intra_link: {bandwidth_GBps: 1}}\n"
                   "inter_node: {bandwidth_GBps: 1}\nlnks: []\n")
    with pytest.raises(SpecError) as info:
        load_cluster(bad)
    assert info.value.line == 4 and info.value.path == "lnks"


def test_a_bad_device_profile_is_named_not_the_cluster_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A broken entry of this host's catalog met while a cluster file is read: the error names the
    profile file and its field (the cluster file and its line have nothing wrong)."""
    from planner.catalog import _cached

    (tmp_path / "devices").mkdir()
    profile = tmp_path / "devices" / "a100-sxm-80g.json"
    profile.write_text((ROOT / "planner" / "profiles" / "devices" / "a100-sxm-80g.json").read_text()
                       .replace('"memory_gib": 80', '"memory_gib": "x"'))
    monkeypatch.setenv("HEXISCALE_HOME", str(tmp_path))
    _cached.cache_clear()
    try:
        with pytest.raises(SpecError) as info:
            load_cluster(ROOT / "examples" / "clusters" / "demo-cpu-6.yaml")
    finally:
        _cached.cache_clear()
    assert info.value.file == str(profile) and info.value.path == "memory_gib" and info.value.line is None


@pytest.mark.parametrize("written, message, hint", [
    ("3e2", "got the text '3e2': YAML 1.1 reads an exponent as text", "write 300 or 3.0e+2"),
    ("1e-3", "got the text '1e-3': YAML 1.1 reads an exponent as text", "write 1.0e-3"),
    ('"25"', "got the text '25'", "write 25 without quotes"),
])
def test_a_number_yaml_reads_as_text_says_how_to_write_it(tmp_path: Path, written: str, message: str,
                                                           hint: str) -> None:
    """PyYAML (YAML 1.1) reads ``3e2`` as the text '3e2': an exponent needs a dot and a sign."""
    bad = tmp_path / "c.yaml"
    bad.write_text(f"nodes:\n  - {{name: a, gpu: a100, gpus: 2, intra_link: {{bandwidth_GBps: {written}}}}}\n"
                   "inter_node: {bandwidth_GBps: 1}\n")
    with pytest.raises(SpecError) as info:
        load_cluster(bad)
    assert info.value.path == "nodes[0].intra_link.bandwidth_GBps"
    assert message in info.value.message and info.value.hint == hint


def test_compact_entries_are_counted_before_they_are_expanded(monkeypatch: pytest.MonkeyPatch) -> None:
    """300 lines of ``count: 4096`` (26 KB of YAML) were expanded to 1.2 million nodes before the
    node limit (then 4,096) was checked (seconds and a quarter GB; a 2 MB file, minutes and gigabytes):
    the entry that crosses the limit is refused with no node of it built."""
    import planner.cluster as cluster_module

    built = []
    monkeypatch.setattr(cluster_module, "Node", lambda *a: built.append(a) or cluster_module.Link("x", 1, 0))
    data = base()
    data["nodes"] = [{"name": f"n{i}", "count": 4096, "gpu": "rtx4090", "gpus": 64, "intra_link": LINK}
                     for i in range(300)]
    with pytest.raises(SpecError) as info:
        parse_cluster(data)
    limit = cluster_module.MAX_NODES  # 8,192: the entry that crosses it is the one refused
    assert info.value.path == f"nodes[{limit // 4096}].count"
    assert f"the {limit:,} HexiScale handles" in info.value.message
    assert len(built) == limit


class _CountedTuple(tuple):  # type: ignore[type-arg]
    """A tuple that counts how often it is walked."""

    walks = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        type(self).walks += 1
        return super().__iter__()


def test_a_link_query_walks_no_list_of_pairs_or_groups() -> None:
    """Each ``link`` query used to scan every ``links`` pair and every group's node list: with
    thousands of either, a planner asking for many device pairs did (pairs x groups) work per
    question. The lookups are built once, at construction; queries walk neither list."""
    from dataclasses import replace

    data = base()
    data["nodes"][1]["count"] = 400
    names = ["a"] + [f"b-{i}" for i in range(400)]
    data["links"] = [{"between": [names[i], names[i + 1]], "link": {"bandwidth_GBps": 7}} for i in range(400)]
    data["groups"] = [{"name": "all", "nodes": names, "link": {"bandwidth_GBps": 3}}] + [
        {"name": f"g{i}", "nodes": names[i:i + 40], "link": {"bandwidth_GBps": 9 + i}} for i in range(0, 400, 20)]
    c = parse_cluster(data)
    counted = replace(c, pair_links=_CountedTuple(c.pair_links), groups=_CountedTuple(c.groups))
    walks = _CountedTuple.walks
    answers = [counted.link(f"{x}:0", f"{y}:1").bandwidth_GBps for x in names[::7] for y in names[::5]]
    assert _CountedTuple.walks == walks  # no query walked either list
    assert answers == [c.link(f"{x}:0", f"{y}:1").bandwidth_GBps for x in names[::7] for y in names[::5]]
    assert counted.link("a:0", "b-0:0").bandwidth_GBps == 7  # a pair override
    assert counted.link("b-2:0", "b-5:0").bandwidth_GBps == 9  # the smallest group holding both
    assert counted.link("b-25:0", "b-30:0").bandwidth_GBps == 9  # of two as small, the first in the file
    assert counted.link("b-2:0", "b-300:0").bandwidth_GBps == 3  # only the group of all
    del data["groups"]
    assert parse_cluster(data).link("a:0", "b-300:0").bandwidth_GBps == 1.25  # no pair, no group: inter_node

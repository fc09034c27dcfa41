"""Cluster description (YAML): nodes, links, groups and per-device overrides.

Example::

    name: lab
    nodes:
      - {name: a100, gpu: a100-sxm-80g, gpus: 8,
         intra_link: {kind: nvlink, bandwidth_GBps: 300, latency_us: 2}}
      - {name: r4090, count: 3, gpu: rtx4090, gpus: 8,          # compact: r4090-0 .. r4090-2
         calibration: r4090-host/calibration/rtx4090-measured.json,   # optional: the host calibration pricing it
         intra_link: {kind: pcie, bandwidth_GBps: 25, latency_us: 8}}
    inter_node: {kind: ethernet, bandwidth_GBps: 1.25, latency_us: 50}
    groups:                     # optional: faster links inside a rack or site
      - {name: rack0, nodes: [a100, r4090-0], link: {kind: infiniband, bandwidth_GBps: 25, latency_us: 5}}
    links:                      # optional: one node pair
      - {between: [r4090-1, r4090-2], link: {kind: infiniband, bandwidth_GBps: 12.5, latency_us: 5}}
    devices:                    # optional: per-device overrides
      "r4090-2:7": {memory_gib: 20, slowdown: 1.3}

Bandwidths are GB/s (gigabytes) per direction, latencies microseconds. Device ids are
``node-name:local-index``. The link between two devices is: the node's ``intra_link`` on one node;
else a ``links`` pair override; else the link of the smallest group holding both nodes; else
``inter_node``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.calibration.ref import resolve_calibration_ref
from planner.catalog import Catalog, default_catalog
from planner.documents import MAX_YAML_BYTES, line_of, load_yaml_document, read_user_text
from planner.errors import SpecError
from planner.fields import (
    check_keys,
    expect_list,
    expect_mapping,
    get_float,
    get_int,
    get_str,
    join,
)
from planner.names import check_label, check_name
from planner.ranges import check_number

MAX_GPUS_PER_NODE = 64
MAX_NODES = 8192  # 32,768 GPUs in nodes of 4 (the scaling benchmark; issue 31)
LINK_KINDS = ("nvlink", "nvswitch", "pcie", "infiniband", "roce", "ethernet", "tcp", "other")
# Ranges far beyond real hardware (1 KB/s .. 1 PB/s, up to 1000 s of latency, 1 PiB of memory): values
# outside are typos (a unit mix-up) and would make the cost model's arithmetic meaningless.
BANDWIDTH_GBPS = (1e-6, 1e6)
MAX_LATENCY_US = 1e9
MAX_MEMORY_GIB = 1e6
MAX_SLOWDOWN = 1e6


@dataclass(frozen=True)
class Link:
    kind: str
    bandwidth_GBps: float
    latency_us: float

    def transfer_s(self, nbytes: float) -> float:
        """Time for one point-to-point message of ``nbytes`` (latency + size / bandwidth)."""
        return self.latency_us * 1e-6 + nbytes / (self.bandwidth_GBps * 1e9)


@dataclass(frozen=True)
class Node:
    name: str
    gpu: str  # canonical catalog key
    gpus: int
    intra_link: Link
    calibration: str | None = None  # the host calibration file pricing this node (planner.calibration.ref)


@dataclass(frozen=True)
class Group:
    name: str
    nodes: tuple[str, ...]
    link: Link


@dataclass(frozen=True)
class DeviceOverride:
    memory_gib: float | None = None
    slowdown: float = 1.0


@dataclass(frozen=True)
class Device:
    """One GPU of the cluster. ``slowdown`` >= 1 divides its compute speed."""

    id: str
    node: str
    local_index: int
    gpu: str
    memory_gib: float
    slowdown: float


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    nodes: tuple[Node, ...]
    inter_node: Link
    groups: tuple[Group, ...] = ()
    pair_links: tuple[tuple[str, str, Link], ...] = ()
    overrides: tuple[tuple[str, DeviceOverride], ...] = ()
    catalog: Catalog = field(default_factory=default_catalog, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_devices", self._build_devices())
        object.__setattr__(self, "_node_by_name", {n.name: n for n in self.nodes})
        # link lookups in O(1) (plus the groups holding one node), not a scan of every pair and group
        # per query: the planner asks for links between many device pairs of clusters of 4,096 nodes
        object.__setattr__(self, "_pair_link", {frozenset((a, b)): lk for a, b, lk in reversed(self.pair_links)})
        members = [frozenset(g.nodes) for g in self.groups]
        by_node: dict[str, list[int]] = {}
        for i in sorted(range(len(self.groups)), key=lambda i: len(members[i])):  # smallest first, then file order
            for name in members[i]:
                by_node.setdefault(name, []).append(i)
        object.__setattr__(self, "_groups_of", {n: [(members[i], self.groups[i].link) for i in gs]
                                                for n, gs in by_node.items()})

    def _build_devices(self) -> dict[str, Device]:
        over = dict(self.overrides)
        devices: dict[str, Device] = {}
        for node in self.nodes:
            dtype = self.catalog.get(node.gpu)
            for i in range(node.gpus):
                dev_id = f"{node.name}:{i}"
                o = over.get(dev_id, DeviceOverride())
                devices[dev_id] = Device(dev_id, node.name, i, dtype.key,
                                         o.memory_gib if o.memory_gib is not None else dtype.memory_gib,
                                         o.slowdown)
        return devices

    @property
    def devices(self) -> list[Device]:
        return list(self._devices.values())  # type: ignore[attr-defined]

    @property
    def num_devices(self) -> int:
        return len(self._devices)  # type: ignore[attr-defined]

    def has_device(self, dev_id: str) -> bool:
        return dev_id in self._devices  # type: ignore[attr-defined]

    def device(self, dev_id: str, path: str = "device") -> Device:
        try:
            return self._devices[dev_id]  # type: ignore[attr-defined,no-any-return]
        except KeyError:
            raise SpecError(path, f"device {dev_id!r} is not in cluster {self.name!r}",
                            "device ids look like 'node-name:local-index'; 'hexiscale show CLUSTER' lists the nodes"
                            ) from None

    def node(self, name: str) -> Node:
        return self._node_by_name[name]  # type: ignore[attr-defined,no-any-return]

    def node_link(self, a: str, b: str) -> Link:
        """The link between two nodes: the node's own on one node, else a ``links`` pair override,
        else the smallest group holding both (the first in the file among equals), else ``inter_node``."""
        if a == b:
            return self.node(a).intra_link
        pair: Link | None = self._pair_link.get(frozenset((a, b)))  # type: ignore[attr-defined]
        if pair is not None:
            return pair
        for members, link in self._groups_of.get(a, ()):  # type: ignore[attr-defined]
            if b in members:
                return link  # type: ignore[no-any-return]
        return self.inter_node

    def link(self, dev_a: str, dev_b: str) -> Link:
        """The link two devices talk over."""
        return self.node_link(self.device(dev_a).node, self.device(dev_b).node)

    def slowest_link(self, dev_ids: list[str] | tuple[str, ...]) -> Link | None:
        """The lowest-bandwidth link between any two of ``dev_ids`` (None for one device)."""
        nodes = sorted({self.device(d).node for d in dev_ids})
        if len(dev_ids) < 2:
            return None
        links = [self.node(n).intra_link for n in nodes if sum(self.device(d).node == n for d in dev_ids) > 1]
        links += [self.node_link(a, b) for i, a in enumerate(nodes) for b in nodes[i + 1:]]
        return min(links, key=lambda lk: (lk.bandwidth_GBps, -lk.latency_us))


# --------------------------------------------------------------------------------------- parsing


def parse_link(data: Any, path: str) -> Link:
    data = expect_mapping(data, path)
    check_keys(data, path, ("bandwidth_GBps",), ("kind", "latency_us"))
    low, high = BANDWIDTH_GBPS
    return Link(
        kind=get_str(data, "kind", path, default="other", choices=LINK_KINDS),
        bandwidth_GBps=check_number(join(path, "bandwidth_GBps"), get_float(data, "bandwidth_GBps", path,
                                    positive=True), low, high, unit=" GB/s"),
        latency_us=check_number(join(path, "latency_us"), get_float(data, "latency_us", path, nonnegative=True,
                                default=0.0), 0.0, MAX_LATENCY_US, unit=" us"),
    )


def _parse_nodes(raw: Any, catalog: Catalog, base_dir: Path | None) -> list[Node]:
    nodes: list[Node] = []
    items = expect_list(raw, "nodes")
    if not items:
        raise SpecError("nodes", "a cluster needs at least one node", "add a node entry")
    for i, item in enumerate(items):
        p = join("nodes", i)
        item = expect_mapping(item, p)
        check_keys(item, p, ("name", "gpu", "gpus", "intra_link"), ("count", "calibration"))
        name = check_name(get_str(item, "name", p), join(p, "name"), "node name")
        gpu = catalog.get(get_str(item, "gpu", p), join(p, "gpu")).key
        gpus = get_int(item, "gpus", p, minimum=1, maximum=MAX_GPUS_PER_NODE)
        link = parse_link(item["intra_link"], join(p, "intra_link"))
        count = get_int(item, "count", p, minimum=1, default=0, maximum=MAX_NODES) if "count" in item else 0
        if len(nodes) + max(count, 1) > MAX_NODES:  # before expanding: 300 lines of count 4096 are 1.2M nodes
            raise SpecError(join(p, "count") if count else p, f"brings the cluster to {len(nodes) + max(count, 1):,} "
                            f"nodes, more than the {MAX_NODES:,} HexiScale handles", "split the cluster")
        cal = resolve_calibration_ref(get_str(item, "calibration", p), join(p, "calibration"), base_dir) \
            if "calibration" in item else None
        names = [f"{name}-{k}" for k in range(count)] if count else [name]
        nodes.extend(Node(n, gpu, gpus, link, cal) for n in names)
    seen: set[str] = set()
    for n in nodes:
        if n.name in seen:
            raise SpecError("nodes", f"duplicate node name {n.name!r}",
                            "give each node (and each compact 'count' expansion) a unique name")
        seen.add(n.name)
    return nodes


def _parse_node_refs(raw: Any, path: str, known: set[str]) -> tuple[str, ...]:
    refs = expect_list(raw, path)
    for j, ref in enumerate(refs):
        if not isinstance(ref, str) or ref not in known:
            raise SpecError(join(path, j), f"unknown node {ref!r}", f"known nodes: {', '.join(sorted(known))}")
    return tuple(refs)


def parse_cluster(data: Any, catalog: Catalog | None = None, base_dir: Path | None = None) -> ClusterSpec:
    """Build a ``ClusterSpec`` from parsed YAML/JSON; every problem is a ``SpecError``. ``base_dir``: the
    folder relative ``calibration:`` paths start from (the cluster file's; default the working folder)."""
    catalog = catalog or default_catalog()
    data = expect_mapping(data, "")
    check_keys(data, "", ("nodes", "inter_node"), ("name", "groups", "links", "devices"))
    nodes = _parse_nodes(data["nodes"], catalog, base_dir)
    known = {n.name for n in nodes}
    inter = parse_link(data["inter_node"], "inter_node")

    groups = []
    for i, g in enumerate(expect_list(data.get("groups", []), "groups")):
        p = join("groups", i)
        g = expect_mapping(g, p)
        check_keys(g, p, ("name", "nodes", "link"))
        name = check_label(get_str(g, "name", p), join(p, "name"), "group name")
        groups.append(Group(name, _parse_node_refs(g["nodes"], join(p, "nodes"), known),
                            parse_link(g["link"], join(p, "link"))))
    if len({g.name for g in groups}) != len(groups):
        raise SpecError("groups", "duplicate group name", "give each group a unique name")

    pairs = []
    first_at: dict[frozenset[str], int] = {}
    for i, pl in enumerate(expect_list(data.get("links", []), "links")):
        p = join("links", i)
        pl = expect_mapping(pl, p)
        check_keys(pl, p, ("between", "link"))
        ends = _parse_node_refs(pl["between"], join(p, "between"), known)
        if len(ends) != 2 or ends[0] == ends[1]:
            raise SpecError(join(p, "between"), "needs exactly two different nodes", "write [node-a, node-b]")
        pair = frozenset(ends)
        if pair in first_at:
            raise SpecError(join(p, "between"), f"the pair {ends[0]}, {ends[1]} is also links[{first_at[pair]}]",
                            "keep one entry per node pair")
        first_at[pair] = i
        pairs.append((ends[0], ends[1], parse_link(pl["link"], join(p, "link"))))

    overrides = []
    dev_ids = {f"{n.name}:{k}" for n in nodes for k in range(n.gpus)}
    raw_over = expect_mapping(data.get("devices", {}), "devices")
    for dev_id, o in raw_over.items():
        p = join("devices", dev_id)
        if dev_id not in dev_ids:
            raise SpecError(p, f"no device {dev_id!r} in this cluster", "use 'node-name:local-index'")
        o = expect_mapping(o, p)
        check_keys(o, p, (), ("memory_gib", "slowdown"))
        mem = check_number(join(p, "memory_gib"), get_float(o, "memory_gib", p, positive=True), 0.0, MAX_MEMORY_GIB,
                           above=True, unit=" GiB") if "memory_gib" in o else None
        slow = check_number(join(p, "slowdown"), get_float(o, "slowdown", p, positive=True, default=1.0), 1.0,
                            MAX_SLOWDOWN, hint="slowdown divides the GPU's speed: 1.3 means 30 % slower")
        overrides.append((dev_id, DeviceOverride(mem, slow)))

    return ClusterSpec(
        name=check_label(get_str(data, "name", "", default="cluster"), "name", "the cluster's name"),
        nodes=tuple(nodes), inter_node=inter, groups=tuple(groups), pair_links=tuple(pairs),
        overrides=tuple(overrides), catalog=catalog,
    )


def load_cluster(path: str | Path, catalog: Catalog | None = None) -> ClusterSpec:
    """Read and validate a cluster file; errors carry the file name and line."""
    path = Path(path)
    data, lines = load_yaml_document(read_user_text(path, "cluster", MAX_YAML_BYTES), str(path))
    catalog = catalog or default_catalog()  # its errors ($HEXISCALE_PROFILES, a profile file) are not this file's
    try:
        return parse_cluster(data, catalog, path.resolve().parent)
    except SpecError as exc:
        raise exc.with_file(str(path), line_of(lines, exc.path)) from None


def cluster_to_dict(cluster: ClusterSpec) -> dict[str, Any]:
    """The cluster as plain data, in the file format (compact forms expanded)."""

    def link(lk: Link) -> Mapping[str, Any]:
        return {"kind": lk.kind, "bandwidth_GBps": lk.bandwidth_GBps, "latency_us": lk.latency_us}

    out: dict[str, Any] = {
        "name": cluster.name,
        "nodes": [{"name": n.name, "gpu": n.gpu, "gpus": n.gpus, "intra_link": link(n.intra_link),
                   **({"calibration": n.calibration} if n.calibration else {})} for n in cluster.nodes],
        "inter_node": link(cluster.inter_node),
    }
    if cluster.groups:
        out["groups"] = [{"name": g.name, "nodes": list(g.nodes), "link": link(g.link)} for g in cluster.groups]
    if cluster.pair_links:
        out["links"] = [{"between": [a, b], "link": link(lk)} for a, b, lk in cluster.pair_links]
    if cluster.overrides:
        out["devices"] = {
            d: {k: v for k, v in (("memory_gib", o.memory_gib), ("slowdown", o.slowdown)) if v is not None}
            for d, o in cluster.overrides}
    return out

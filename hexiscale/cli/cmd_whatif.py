"""``hexiscale whatif PLAN [--cluster CLUSTER] CHANGES... [--json]``: re-estimate a plan under a
changed cluster or batch and report old vs new.

Changes (each may repeat; applied in this order):

* ``--remove-node NAME``: drop a node (its links, group memberships and device overrides too);
* ``--add-node 'name=x,gpu=a100-sxm-80g,gpus=8,bw=300[,latency=3,kind=nvlink,count=2]'`` or
  ``--add-node nodes.yaml`` (a node mapping or a list of them, in the cluster-file format);
* ``--inter-bw GBps``: the default inter-node bandwidth;
* ``--link NODE_A,NODE_B=GBps``: a per-pair inter-node bandwidth (latency kept from the current link);
* ``--cap DEVICE=GiB`` and ``--slowdown DEVICE=F``: cap a GPU's memory, slow it down;
* ``--global-batch-size N`` (or ``--global-batch``): scale every pipeline's batch size in proportion
  (largest remainders get the rounding) and its micro-batch count so the micro-batch size stays
  about the same.

The plan itself is not re-planned: devices a change adds stay unused (run the planner for that),
and a change that leaves the plan unable to run (a removed device, a device out of memory)
is refused with an error naming the device.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.table import Table

from hexiscale.cli.cmd_estimate import _s, add_common_arguments, find_cluster, profiles_for, render
from hexiscale.cli.flag_names import GLOBAL_BATCH, add_global_batch, typed
from hexiscale.cli.output import console, styled
from planner.cluster import (
    BANDWIDTH_GBPS,
    MAX_MEMORY_GIB,
    MAX_SLOWDOWN,
    ClusterSpec,
    cluster_to_dict,
    parse_cluster,
)
from planner.cost import BREAKDOWN_TERMS, Estimate, estimate
from planner.documents import MAX_YAML_BYTES, load_yaml_text, read_user_text
from planner.errors import PlanInfeasible, SpecError
from planner.fields import expect_mapping
from planner.plan import MAX_GLOBAL_BATCH, MAX_MICRO_BATCHES, Plan, load_plan
from planner.ranges import check_int, check_number


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("whatif", help="re-estimate a plan under a changed cluster or batch; show the delta")
    add_common_arguments(p)
    p.add_argument("--remove-node", action="append", default=[], metavar="NAME")
    p.add_argument("--add-node", action="append", default=[], metavar="SPEC|FILE",
                   help="'name=x,gpu=KEY,gpus=N,bw=GBps[,latency=us,kind=K,count=C]' or a YAML file")
    p.add_argument("--inter-bw", type=float, metavar="GBps", help="default inter-node bandwidth")
    p.add_argument("--link", action="append", default=[], metavar="A,B=GBps", help="bandwidth between two nodes")
    p.add_argument("--cap", action="append", default=[], metavar="DEVICE=GiB", help="cap a device's memory")
    p.add_argument("--slowdown", action="append", default=[], metavar="DEVICE=F", help="slow a device down (F >= 1)")
    add_global_batch(p, "new samples per step, the total over every pipeline")
    p.add_argument("--details", action="store_true", help="also print the full new estimate")
    p.set_defaults(func=run)


# the range of each flag's number (the cluster file's ranges)
FLAG_RANGES = {"--link": BANDWIDTH_GBPS, "--inter-bw": BANDWIDTH_GBPS, "--cap": (0.0, MAX_MEMORY_GIB),
               "--slowdown": (1.0, MAX_SLOWDOWN)}


def _number(flag: str, value: float, what: str) -> float:
    low, high = FLAG_RANGES[flag]
    return check_number(flag, value, low, high, above=flag == "--cap", hint=f"{what} in [{low:g}, {high:g}]")


def _kv(text: str, flag: str) -> tuple[str, float]:
    key, sep, value = text.rpartition("=")
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not sep or not key or number <= 0:
        raise SpecError(flag, f"cannot read {text!r}", f"write {flag} KEY=POSITIVE_NUMBER")
    return key, _number(flag, number, f"write {flag} {key}=VALUE with VALUE")


def _node_from_spec(text: str) -> list[dict[str, Any]]:
    if Path(text).exists():
        data = load_yaml_text(read_user_text(Path(text), "--add-node", MAX_YAML_BYTES), text)
        nodes = list(data) if isinstance(data, list) else [data]
        try:
            return [dict(expect_mapping(n, f"--add-node[{i}]")) for i, n in enumerate(nodes)]
        except SpecError as exc:
            raise exc.with_file(text) from None
    fields: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep:
            raise SpecError("--add-node", f"cannot read {part!r} in {text!r}",
                            "write 'name=x,gpu=a100-sxm-80g,gpus=8,bw=300' or a YAML file path")
        fields[key.strip()] = value.strip()
    allowed = {"name", "gpu", "gpus", "bw", "latency", "kind", "count"}
    for key in fields:
        if key not in allowed:
            raise SpecError(f"--add-node.{key}", "unknown key", f"allowed: {', '.join(sorted(allowed))}")
    for key in ("name", "gpu", "gpus", "bw"):
        if key not in fields:
            raise SpecError(f"--add-node.{key}", "missing", "write name=..,gpu=..,gpus=..,bw=..")
    try:
        node: dict[str, Any] = {
            "name": fields["name"], "gpu": fields["gpu"], "gpus": int(fields["gpus"]),
            "intra_link": {"kind": fields.get("kind", "nvlink"), "bandwidth_GBps": float(fields["bw"]),
                           "latency_us": float(fields.get("latency", 5))}}
        if "count" in fields:
            node["count"] = int(fields["count"])
    except ValueError as exc:
        raise SpecError("--add-node", f"bad number in {text!r}: {exc}", "gpus and count are integers") from None
    return [node]


def changed_cluster(cluster: ClusterSpec, args: argparse.Namespace) -> tuple[ClusterSpec, list[str]]:
    """Apply the cluster changes of ``args``; returns the new cluster and a description of each."""
    data = cluster_to_dict(cluster)
    notes: list[str] = []
    names = {n["name"] for n in data["nodes"]}
    for name in args.remove_node:
        if name not in names:
            raise SpecError("--remove-node", f"no node {name!r} in cluster {cluster.name!r}",
                            f"nodes: {', '.join(sorted(names))}")
        names.discard(name)
        data["nodes"] = [n for n in data["nodes"] if n["name"] != name]
        data["groups"] = [dict(g, nodes=[x for x in g["nodes"] if x != name]) for g in data.get("groups", [])]
        data["groups"] = [g for g in data["groups"] if g["nodes"]]
        data["links"] = [lk for lk in data.get("links", []) if name not in lk["between"]]
        data["devices"] = {d: o for d, o in data.get("devices", {}).items() if d.rpartition(":")[0] != name}
        notes.append(f"remove node {name}")
    for spec in args.add_node:
        new = _node_from_spec(spec)
        data["nodes"] = list(data["nodes"]) + new
        notes.append("add " + ", ".join(f"{n.get('name')} ({n.get('gpus')}x {n.get('gpu')})" for n in new))
    if args.inter_bw is not None:
        _number("--inter-bw", args.inter_bw, "give GB/s")
        data["inter_node"] = dict(data["inter_node"], bandwidth_GBps=args.inter_bw)
        notes.append(f"inter-node bandwidth {args.inter_bw:g} GB/s")
    for text in args.link:
        pair, bw = _kv(text, "--link")
        ends = [x.strip() for x in pair.split(",")]
        if len(ends) != 2:
            raise SpecError("--link", f"cannot read {text!r}", "write --link NODE_A,NODE_B=GBps")
        try:
            latency = cluster.node_link(ends[0], ends[1]).latency_us
        except KeyError:
            latency = cluster.inter_node.latency_us
        links = [lk for lk in data.get("links", []) if set(lk["between"]) != set(ends)]
        links.append({"between": ends, "link": {"kind": "other", "bandwidth_GBps": bw, "latency_us": latency}})
        data["links"] = links
        notes.append(f"link {ends[0]}-{ends[1]} {bw:g} GB/s")
    devices: dict[str, dict[str, float]] = {d: dict(o) for d, o in data.get("devices", {}).items()}
    for flag, key, items in (("--cap", "memory_gib", args.cap), ("--slowdown", "slowdown", args.slowdown)):
        for text in items:
            dev, value = _kv(text, flag)
            if not cluster.has_device(dev) or dev.partition(":")[0] not in names:
                raise SpecError(flag, f"no device {dev!r} in the cluster", "device ids look like 'node:index'")
            devices.setdefault(dev, {})[key] = value
            notes.append(f"{dev} {key.replace('_gib', '')} {value:g}")
    data["devices"] = devices
    for key in ("groups", "links", "devices"):
        if not data.get(key):
            data.pop(key, None)
    try:
        return parse_cluster(data, cluster.catalog), notes
    except SpecError as exc:
        raise SpecError(exc.path, exc.message, exc.hint, "changed cluster") from None


def _scaled(plan: Plan, new_global: int) -> list[tuple[int, int]]:
    """(batch size, micro-batches) of each pipeline scaled to sum to ``new_global`` (largest
    remainder), each pipeline's micro-batch size kept about the same."""
    old = plan.global_batch_size
    exact = [p.batch_size * new_global / old for p in plan.pipelines]
    sizes = [max(1, int(x)) for x in exact]
    order = sorted(range(len(sizes)), key=lambda i: exact[i] - int(exact[i]), reverse=True)
    k = 0
    while sum(sizes) != new_global:
        i = order[k % len(order)]
        if sum(sizes) < new_global:
            sizes[i] += 1
        elif sizes[i] > 1:
            sizes[i] -= 1
        k += 1
    return [(b, min(b, max(1, round(b / (p.batch_size / p.micro_batches)))))
            for p, b in zip(plan.pipelines, sizes, strict=True)]


def _largest_global(plan: Plan, upto: int) -> int:
    """The largest global batch below ``upto`` whose scaled pipelines stay within
    ``MAX_MICRO_BATCHES`` (bisection: the counts grow with the global batch)."""
    lo, hi = len(plan.pipelines), upto
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if max(m for _, m in _scaled(plan, mid)) <= MAX_MICRO_BATCHES else (lo, mid)
    return lo


def scale_batch(plan: Plan, new_global: int, flag: str = GLOBAL_BATCH) -> Plan:
    """Scale every pipeline's batch to sum to ``new_global`` (largest remainder), keeping each
    pipeline's micro-batch size about the same; refused, naming the flag, where that takes more
    micro-batches than a pipeline may run."""
    if new_global < len(plan.pipelines):
        raise SpecError(flag, f"{new_global} is fewer than the plan's {len(plan.pipelines)} pipelines",
                        "every pipeline needs at least one sample")
    scaled = _scaled(plan, new_global)
    for i, (p, (_, micro)) in enumerate(zip(plan.pipelines, scaled, strict=True)):
        if micro > MAX_MICRO_BATCHES:
            raise SpecError(flag, f"{new_global} would give pipelines[{i}] {micro:,} micro-batches "
                            f"(keeping the plan's {p.batch_size / p.micro_batches:g} samples per micro-batch); a "
                            f"pipeline runs at most {MAX_MICRO_BATCHES:,}",
                            f"pass at most {_largest_global(plan, new_global)}, or a plan with larger micro-batches")
    pipes = [replace(p, batch_size=b, micro_batches=m) for p, (b, m) in zip(plan.pipelines, scaled, strict=True)]
    return replace(plan, global_batch_size=new_global, pipelines=tuple(pipes), estimate=None)


def _given(args: argparse.Namespace) -> str:
    """The change flags as the user typed them (``--cap a100:0=2``), for an error that blames them."""
    flags = [("--remove-node", args.remove_node), ("--add-node", args.add_node), ("--link", args.link),
             ("--cap", args.cap), ("--slowdown", args.slowdown)]
    said = [f"{flag} {v}" for flag, values in flags for v in values]
    batch = typed(args, "global_batch", GLOBAL_BATCH)
    said += [f"{flag} {v:g}" for flag, v in (("--inter-bw", args.inter_bw), (batch, args.global_batch))
             if v is not None]
    return ", ".join(said) or "the change"


def _row(est: Estimate) -> dict[str, float]:
    row = {"step time": est.step_time_s, "tokens/s": est.tokens_per_s, "MFU %": est.mfu * 100,
           "HFU %": est.hfu * 100, "max memory GiB": max(est.memory_gib.values())}
    row.update({k: est.breakdown[k] for k in BREAKDOWN_TERMS})
    return row


def run(args: argparse.Namespace) -> int:
    plan = load_plan(args.plan)
    cluster = find_cluster(plan, args.plan, args.cluster)
    before = estimate(plan, cluster, profiles_for(args, cluster))
    new_cluster, notes = changed_cluster(cluster, args)
    new_plan = plan
    if args.global_batch is not None:
        flag = typed(args, "global_batch", GLOBAL_BATCH)
        check_int(flag, args.global_batch, 1, MAX_GLOBAL_BATCH, "pass the new samples per step")
        new_plan = scale_batch(plan, args.global_batch, flag)
        notes.append(f"global batch {plan.global_batch_size} -> {args.global_batch}")
    if not notes:
        raise SpecError("whatif", "no change given", "add --remove-node, --add-node, --inter-bw, --link, --cap, "
                        f"--slowdown or {GLOBAL_BATCH}")
    try:
        after = estimate(new_plan, new_cluster, profiles_for(args, new_cluster, say=False))
    except SpecError as exc:
        raise SpecError(exc.path, f"the plan no longer fits the changed cluster: {exc.message}",
                        "re-plan for the new cluster (hexiscale plan)") from None
    if after.oom and not before.oom:
        try:
            after.check_fits()
        except PlanInfeasible as exc:
            raise PlanInfeasible(exc.path, f"the plan no longer fits after {_given(args)}: {exc.message}",
                                 exc.hint) from None
    unused = new_cluster.num_devices - new_plan.world_size
    if args.json:
        print(json.dumps({"changes": notes, "before": before.to_dict(), "after": after.to_dict(),
                          "unused_devices": unused}, indent=2))
        return 0
    console.print("what if: " + "; ".join(notes), highlight=False)
    table = Table(title="before -> after", title_justify="left")
    for col in ("", "before", "after", "delta"):
        table.add_column(col, justify="left" if not col else "right")
    old, new = _row(before), _row(after)
    for key in old:
        a, b = old[key], new[key]
        pct = f" ({(b - a) / a * 100:+.1f} %)" if a else ""
        if key in BREAKDOWN_TERMS or key == "step time":
            table.add_row(key, _s(a), _s(b), f"{'+' if b >= a else '-'}{_s(abs(b - a))}{pct}")
        else:
            table.add_row(key, f"{a:,.2f}", f"{b:,.2f}", f"{b - a:+,.2f}{pct}")
    console.print(table)
    bb, ab = before.bottleneck, after.bottleneck
    console.print(f"bottleneck: {bb['term']} on {bb['device']} -> {ab['term']} on {ab['device']}", highlight=False)
    if before.oom:
        console.print(styled(("note", "red"), ": the plan was already out of memory before the change on "
                             f"{', '.join(o['device'] for o in before.oom)}"))
    if unused > 0:
        console.print(f"{unused} devices of the changed cluster are unused by this plan; re-plan to use them",
                      highlight=False)
    if args.details:
        render(new_plan, new_cluster, after, title="after")
    return 0

"""``hexiscale show FILE [--cluster CLUSTER] [--plot DIR] [--step K]``: a readable table of a plan,
a cluster or a trace (``hexiscale train --trace``); ``--plot`` also draws the plan map and, for a
trace, the measured timeline of one traced step (default: the last) as PNGs in DIR."""

from __future__ import annotations

import argparse

from hexiscale.cli.loading import load_any
from hexiscale.cli.output import cluster_table, console, plan_table, print_warning
from hexiscale.cli.pictures import MEASURED, timeline_table, write_pictures
from planner.cluster import ClusterSpec, load_cluster
from planner.errors import SpecError
from planner.plan import Plan
from planner.timeline import Timeline
from planner.validate import other_cluster, validate


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("show", help="print a plan, cluster or trace as a table (--plot: PNGs)")
    p.add_argument("file", help="plan (JSON), cluster (YAML) or trace (JSON from 'hexiscale train --trace')")
    p.add_argument("--cluster", help="cluster file, to show each stage's GPU type")
    p.add_argument("--plot", metavar="DIR", help=f"write plan-map.png (and for a trace {MEASURED}) to DIR")
    p.add_argument("--step", type=int, help="the traced step to show (default: the last one traced)")
    p.set_defaults(func=run)


def _pick(timelines: list[Timeline], step: int | None) -> Timeline:
    if step is None:
        return timelines[-1]
    for t in timelines:
        if t.title == f"measured step {step}":
            return t
    traced = ", ".join(t.title.rpartition(" ")[2] for t in timelines)
    raise SpecError("--step", f"step {step} was not traced", f"traced steps: {traced}")


def run(args: argparse.Namespace) -> int:
    obj = load_any(args.file)
    if isinstance(obj, ClusterSpec):
        if args.plot:
            raise SpecError("--plot", "draws plans and traces, not clusters", "pass a plan or trace file")
        console.print(cluster_table(obj))
        return 0
    plan, timelines = (obj, []) if isinstance(obj, Plan) else obj
    cluster = load_cluster(args.cluster) if args.cluster else None
    if cluster is not None:
        validate(plan, cluster)
        print_warning(other_cluster(plan, cluster))
    console.print(plan_table(plan, cluster))
    timeline = _pick(timelines, args.step) if timelines else None
    if timeline is not None:
        console.print(timeline_table(timeline))
    if args.plot:
        write_pictures(args.plot, plan, cluster, timeline, MEASURED,
                       "per-rank events; p2p and grad sync include waiting for peers")
    return 0

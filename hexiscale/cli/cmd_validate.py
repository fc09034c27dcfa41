"""``hexiscale validate FILE [--cluster CLUSTER]``: check a cluster, plan or trace file."""

from __future__ import annotations

import argparse

from hexiscale.cli.loading import load_any
from hexiscale.cli.output import console, print_warning
from planner.cluster import load_cluster
from planner.plan import Plan
from planner.validate import other_cluster, validate


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("validate", help="check a cluster (YAML) or plan (JSON) file; exit 0 if valid")
    p.add_argument("file", nargs="+", help="cluster or plan files")
    p.add_argument("--cluster", help="also check a plan's devices against this cluster file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cluster = load_cluster(args.cluster) if args.cluster else None
    for file in args.file:
        obj = load_any(file)
        if isinstance(obj, Plan):
            if cluster is not None:
                validate(obj, cluster)
                print_warning(other_cluster(obj, cluster))
            console.print(f"{file}: OK (plan, {len(obj.pipelines)} pipelines, {obj.world_size} devices)",
                          highlight=False)
        elif isinstance(obj, tuple):
            console.print(f"{file}: OK (trace of {len(obj[1])} steps, {obj[0].world_size} ranks)", highlight=False)
        else:
            console.print(f"{file}: OK (cluster {obj.name!r}, {len(obj.nodes)} nodes, {obj.num_devices} devices)",
                          highlight=False)
    return 0

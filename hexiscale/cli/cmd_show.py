"""``hexiscale show FILE [--cluster CLUSTER]``: a readable table of a plan or cluster."""

from __future__ import annotations

import argparse

from hexiscale.cli.loading import load_any
from hexiscale.cli.output import cluster_table, console, plan_table
from planner.cluster import load_cluster
from planner.plan import Plan
from planner.validate import validate


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("show", help="print a plan or cluster as a table")
    p.add_argument("file", help="plan (JSON) or cluster (YAML)")
    p.add_argument("--cluster", help="cluster file, to show each stage's GPU type")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    obj = load_any(args.file)
    if isinstance(obj, Plan):
        cluster = load_cluster(args.cluster) if args.cluster else None
        if cluster is not None:
            validate(obj, cluster)
        console.print(plan_table(obj, cluster))
    else:
        console.print(cluster_table(obj))
    return 0

"""Checks of a plan against a cluster (the structural ones run when the plan is built)."""

from __future__ import annotations

from planner.cluster import ClusterSpec
from planner.errors import SpecError
from planner.plan import Plan


def other_cluster(plan: Plan, cluster: ClusterSpec) -> str | None:
    """A one-line warning when the plan was made for another cluster than ``cluster`` (by name):
    its devices may exist there with other GPUs and links, so estimates and runs differ from the
    plan's own cluster's. ``None`` when the names agree or the plan names no cluster."""
    if plan.cluster is None or plan.cluster == cluster.name:
        return None
    return (f"the plan was made for cluster {plan.cluster!r} but is checked against cluster {cluster.name!r} "
            f"(pass {plan.cluster}'s file as --cluster if that is what you meant)")


def validate(plan: Plan, cluster: ClusterSpec) -> None:
    """Raise ``SpecError`` naming the field if ``plan`` cannot run on ``cluster``."""
    for pi, pipe in enumerate(plan.pipelines):
        for si, stage in enumerate(pipe.stages):
            for di, dev in enumerate(stage.devices):
                path = f"pipelines[{pi}].stages[{si}].devices[{di}]"
                if not cluster.has_device(dev):
                    if plan.cluster is not None and plan.cluster != cluster.name:
                        raise SpecError(path, f"device {dev!r} is not in cluster {cluster.name!r}: the plan "
                                        f"was made for cluster {plan.cluster!r}",
                                        f"pass {plan.cluster}'s file as --cluster")
                    nodes = ", ".join(f"{n.name} ({n.gpus} GPUs)" for n in cluster.nodes[:6])
                    more = " ..." if len(cluster.nodes) > 6 else ""
                    raise SpecError(path, f"device {dev!r} is not in cluster {cluster.name!r}",
                                    f"ids are 'node:index' with nodes {nodes}{more}")

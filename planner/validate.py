"""Checks of a plan against a cluster (the structural ones run when the plan is built)."""

from __future__ import annotations

from planner.cluster import ClusterSpec
from planner.errors import SpecError
from planner.plan import Plan


def validate(plan: Plan, cluster: ClusterSpec) -> None:
    """Raise ``SpecError`` naming the field if ``plan`` cannot run on ``cluster``."""
    for pi, pipe in enumerate(plan.pipelines):
        for si, stage in enumerate(pipe.stages):
            for di, dev in enumerate(stage.devices):
                path = f"pipelines[{pi}].stages[{si}].devices[{di}]"
                if not cluster.has_device(dev):
                    nodes = ", ".join(f"{n.name} ({n.gpus} GPUs)" for n in cluster.nodes[:6])
                    more = " ..." if len(cluster.nodes) > 6 else ""
                    raise SpecError(path, f"device {dev!r} is not in cluster {cluster.name!r}",
                                    f"ids are 'node:index' with nodes {nodes}{more}")

"""``hexiscale launch PLAN --local --elastic|--elastic-trace``: the flags of ``hexiscale launch`` turned into an
elastic :class:`~hexiscale.launch.elastic.Supervisor` (checked first, one ``SpecError`` line each)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from hexiscale.launch.elastic import ElasticOptions, Supervisor, _flag
from planner.errors import SpecError
from planner.plan import Plan
from planner.varlen.layout_doc import Layout, home_plan
from planner.varlen.pool import StrategyPool


def launch_elastic(args: argparse.Namespace, layout: Layout, run_id: str, *, env: dict[str, str]) -> int:
    """``layout``: the launch plan, or a strategy pool (its home plan places the ranks)."""
    from planner.cluster import load_cluster
    from planner.elastic_trace import load_trace
    from planner.validate import validate

    if not args.local:
        raise SpecError("--elastic", "elastic jobs run on one machine for now", "add --local")
    plan = home_plan(layout)
    cluster = load_cluster(args.cluster) if args.cluster else None
    if cluster is not None:
        for st in layout.strategies if isinstance(layout, StrategyPool) else ():
            validate(st.plan, cluster)
        validate(plan, cluster)
    trace = None
    train_args = list(args.train_args) + (["--cluster", os.path.abspath(args.cluster)] if args.cluster else [])
    if args.elastic_trace:
        if cluster is None:
            raise SpecError("--cluster", "missing", "a trace names devices of a cluster file: pass --cluster")
        trace = load_trace(args.elastic_trace, cluster=cluster, plan=layout)
        steps = _flag(train_args, "--steps")
        if steps is None:
            train_args += ["--steps", str(trace.total_steps)]
        elif steps != str(trace.total_steps):
            raise SpecError("--steps", f"{steps}, but the trace's phases last {trace.total_steps} steps",
                            "drop --steps (the trace sets it) or fix the trace")
        stop = _flag(train_args, "--stop-at")
        late = [p.start for p in trace.phases[1:] if stop is not None and p.start >= int(stop)]
        if late:  # its joining devices would wait for a switch that never comes
            raise SpecError("--stop-at", f"{stop}, but the trace changes the devices after step {late[0]}",
                            f"pass --stop-at {trace.phases[-1].start + 1} or more, or end the trace sooner")
    devices = {d for d in plan.devices} | {d for p in (trace.phases if trace else ()) for d in p.devices}
    device = args.device
    if device == "auto":
        from executor.model.devices import cuda_device_count

        device = "cuda" if cuda_device_count() >= len(devices) else "cpu"
    refuse_sm_share_on_cpu(args.sm_percent, device)
    opts = ElasticOptions(train_args, device=device, run_id=run_id, grace_s=args.grace,
                          max_restarts=args.max_restarts, report_jsonl=args.elastic_log, extra_env=env,
                          shares=_shares(args.sm_percent, cluster, plan))
    return Supervisor(layout, cluster, opts, trace).run()


def refuse_sm_share_on_cpu(items: list[str], device: str) -> None:
    """``--sm-percent`` shares a GPU's SMs (CUDA MPS); a CPU run has none to share."""
    if items and device == "cpu":
        raise SpecError("--sm-percent", "this run is on the CPU (gloo), which has no SMs to share",
                        "drop --sm-percent, or run on GPUs with --device cuda")


def parse_sm_percent(items: list[str]) -> list[tuple[str, float]]:
    """``--sm-percent NODE=PCT`` items as (node, share), each checked (0 < PCT <= 100)."""
    out = []
    for i, item in enumerate(items):
        node, sep, pct = item.partition("=")
        try:
            value = float(pct)
        except ValueError:
            value = -1.0
        if not sep or not 0 < value <= 100:
            raise SpecError(f"--sm-percent[{i}]", f"{item!r} is not NODE=PCT with 0 < PCT <= 100",
                            "write e.g. --sm-percent slow=50")
        out.append((node, value))
    return out


def _shares(items: list[str], cluster: Any, plan: Plan) -> dict[str, float]:
    """``--sm-percent NODE=PCT``: that share for every device of the node, whenever it runs."""
    ids = [d.id for d in cluster.devices] if cluster is not None else list(plan.devices)
    out: dict[str, float] = {}
    for i, (node, value) in enumerate(parse_sm_percent(items)):
        mine = [d for d in ids if d.partition(":")[0] == node]
        if not mine:
            raise SpecError(f"--sm-percent[{i}]", f"node {node!r} holds no device of the job",
                            f"use one of: {', '.join(dict.fromkeys(d.partition(':')[0] for d in ids))}")
        out.update({d: value for d in mine})
    return out

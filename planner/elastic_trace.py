"""Elastic traces (``hexiscale.trace/1`` YAML): the device set of a job, phase by phase (pure).

Example (HSPMD-style C1 -> C2 -> C1 traces; ``hexiscale launch PLAN --local --elastic-trace FILE``)::

    format: hexiscale.trace/1
    phases:
      - steps: 20                                  # phase 0: the launch plan's devices
      - steps: 20
        devices: [fast:0, fast:1, slow:0]          # slow:1 leaves
      - steps: 10
        devices: [fast:0, fast:1, slow:0, slow:1]  # it joins again
        plan: plans/four.json                      # optional: this phase's plan (or pool), else re-planned
        sm_percent: {slow: 50}                     # optional, GPU emulation: MPS share per node

Phase ``i`` runs steps ``[start_i, start_i + steps_i)`` (``start_0 = 0``); between two phases the
job switches layout in process (:mod:`executor.switch.state_move`). A phase without ``plan`` is re-planned for
its devices, warm-started from the previous phase's plan (:mod:`planner.replan`). Phase 0 runs
the launch plan; its ``devices``, if given, must be that plan's. A job that trains a strategy pool
has pools for plans: the launch pool, a phase's ``plan`` file a pool too, each re-planned phase's
pool every strategy re-planned (:mod:`planner.varlen.replan_pool`); its devices are its home plan's.
``plan`` paths are relative to the trace file; a phase's plan may leave some of its devices idle
(the planner does that for small models) but must not use others.

``sm_percent`` gives the devices of a node an MPS share of their GPU's SMs (0 < PCT <= 100).
A device's share is fixed for its process, so a device present in two consecutive phases must
keep its share there (make it leave and join again to change it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.cluster import ClusterSpec
from planner.documents import load_yaml_text, read_user_text
from planner.errors import SpecError
from planner.fields import check_keys, expect_list, expect_mapping, get_int, join
from planner.plan import Plan
from planner.varlen.layout_doc import Layout, home_plan
from planner.varlen.pool import StrategyPool, load_plan_or_pool

TRACE_FORMAT = "hexiscale.trace/1"


@dataclass(frozen=True)
class Phase:
    start: int  # first step (0-based) of the phase
    steps: int
    devices: tuple[str, ...]
    plan: Layout | None = None  # None: re-planned (phase 0: the launch plan); a pool in a pool's job
    sm_percent: dict[str, float] = field(default_factory=dict)  # device -> MPS share

    @property
    def end(self) -> int:
        return self.start + self.steps


@dataclass(frozen=True)
class Trace:
    phases: tuple[Phase, ...]

    @property
    def total_steps(self) -> int:
        return self.phases[-1].end


def parse_trace(data: Any, *, cluster: ClusterSpec, plan: Layout, base: Path = Path(".")) -> Trace:
    """A trace from parsed YAML; ``plan`` is the launch plan or pool (phase 0)."""
    data = expect_mapping(data, "")
    check_keys(data, "", ("phases",), ("format",))
    if data.get("format", TRACE_FORMAT) != TRACE_FORMAT:
        raise SpecError("format", f"unsupported trace format {data.get('format')!r}", f"write {TRACE_FORMAT!r}")
    items = expect_list(data["phases"], "phases")
    if not items:
        raise SpecError("phases", "a trace needs at least one phase", "add '- steps: N'")
    phases: list[Phase] = []
    start = 0
    for i, item in enumerate(items):
        p = join("phases", i)
        item = expect_mapping(item, p)
        check_keys(item, p, ("steps",), ("devices", "plan", "sm_percent"))
        steps = get_int(item, "steps", p, minimum=1)
        given: Layout | None = None
        if "plan" in item:
            if not isinstance(item["plan"], str):
                raise SpecError(join(p, "plan"), f"expected a plan file path, got {item['plan']!r}", "write a path")
            loaded, pool = load_plan_or_pool(base / item["plan"])
            given = pool if pool is not None else loaded
            if isinstance(given, StrategyPool) != isinstance(plan, StrategyPool):
                raise SpecError(join(p, "plan"), "a strategy pool, but the job trains a plan" if pool is not None
                                else "a plan, but the job trains a strategy pool",
                                "give a layout of the launch's kind, or drop it to re-plan the phase")
        if i == 0:
            if given is not None:
                raise SpecError(join(p, "plan"), "phase 0 runs the launch plan", "drop it, or launch that plan")
            given = plan
        devices = _devices(item, p, cluster, None if given is None else home_plan(given))
        if given is not None:
            _check_plan(home_plan(given), devices, home_plan(plan), join(p, "plan"))
        phases.append(Phase(start, steps, devices, given, _shares(item, p, cluster, devices)))
        start += steps
    for i, (a, b) in enumerate(zip(phases, phases[1:])):
        for d in set(a.devices) & set(b.devices):
            if a.sm_percent.get(d, 100.0) != b.sm_percent.get(d, 100.0):
                raise SpecError(f"phases[{i + 1}].sm_percent", f"device {d} runs in phases {i} and {i + 1} with "
                                f"SM shares {a.sm_percent.get(d, 100.0):g} and {b.sm_percent.get(d, 100.0):g} %",
                                "a running process keeps its share: let the device leave for a phase first")
    return Trace(tuple(phases))


def load_trace(path: str | Path, *, cluster: ClusterSpec, plan: Layout) -> Trace:
    path = Path(path)
    text = read_user_text(path, "trace")
    try:
        return parse_trace(load_yaml_text(text, str(path)), cluster=cluster, plan=plan, base=path.parent)
    except SpecError as exc:
        raise exc.with_file(str(path)) from None


def _devices(item: Any, path: str, cluster: ClusterSpec, plan: Plan | None) -> tuple[str, ...]:
    if "devices" not in item:
        if plan is None:
            raise SpecError(join(path, "devices"), "missing (and no plan)", "list the phase's devices")
        return tuple(plan.devices)
    raw = item["devices"]
    if raw == "all":
        return tuple(d.id for d in cluster.devices)
    devs = expect_list(raw, join(path, "devices"))
    for j, d in enumerate(devs):
        if not isinstance(d, str):
            raise SpecError(join(join(path, "devices"), j), f"expected a device id, got {d!r}", "write 'node:index'")
        cluster.device(d, join(join(path, "devices"), j))
    if not devs or len(set(devs)) != len(devs):
        raise SpecError(join(path, "devices"), "empty, or a device listed twice", "list each device once")
    return tuple(devs)


def _check_plan(plan: Plan, devices: Sequence[str], launch: Plan, path: str) -> None:
    extra = sorted(set(plan.devices) - set(devices))
    if extra:
        raise SpecError(path, f"the plan uses {extra}, which the phase does not list",
                        "add them to the phase's devices or use another plan")
    if plan.model != launch.model or plan.global_batch_size != launch.global_batch_size:
        raise SpecError(path, "trains another model or global batch than the launch plan",
                        "every phase trains the same model with the same global batch")


def _shares(item: Any, path: str, cluster: ClusterSpec, devices: Sequence[str]) -> dict[str, float]:
    raw = expect_mapping(item.get("sm_percent", {}), join(path, "sm_percent"))
    out: dict[str, float] = {}
    for node, pct in raw.items():
        p = join(join(path, "sm_percent"), node)
        if node not in {n.name for n in cluster.nodes}:
            raise SpecError(p, f"unknown node {node!r}", "use a node name of the cluster")
        if isinstance(pct, bool) or not isinstance(pct, int | float) or not 0 < pct <= 100:
            raise SpecError(p, f"expected a share in (0, 100], got {pct!r}", "write e.g. 50")
        out.update({d: float(pct) for d in devices if cluster.device(d).node == node})
    return out

"""What each stage (or rank) does during one training step, in time: the data behind the timeline
pictures, from the cost model's simulator (:func:`planner.cost.estimate` with ``timeline=True``) or
from a run's measured events (``hexiscale train --trace FILE``).

A *lane* is one stage (simulated) or one rank (measured); its *spans* are ``(kind, micro-batch,
start, end)`` in seconds from the step's start, kinds :data:`SPAN_KINDS`. Time in a lane that no
span covers is idle.

The trace file (``hexiscale.trace/1``, written by rank 0 of a ``--trace`` run)::

    {"format": "hexiscale.trace/1", "plan": {plan JSON},
     "steps": [{"step": k, "ranks": [{"rank": r, "events": [[kind, mb, start_s, end_s], ...],
                                      "peak_memory_gib": x}, ...]}]}

Times count from the step's start on the earliest rank (a barrier starts the step; each rank's
anchor is placed by its wall clock, :mod:`executor.train.trace`). Measured ``p2p`` spans include the wait
for the peer (a receive blocks until the sender is ready), and ``grad_sync`` is the part of the
gradient reduction left after the schedule, waits for the other pipelines included.
``peak_memory_gib`` (optional; older traces lack it) is the rank's peak memory so far at the end of
the step: the allocator's peak on CUDA, the resident set on CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.documents import load_json_file
from planner.errors import SpecError
from planner.fields import expect_list, expect_mapping
from planner.plan import Plan, plan_from_dict

TRACE_FORMAT = "hexiscale.trace/1"
SPAN_KINDS = ("forward", "backward", "p2p", "grad_sync", "optimizer")


@dataclass(frozen=True)
class Span:
    kind: str  # one of SPAN_KINDS
    micro_batch: int  # -1 when the span belongs to no micro-batch (grad_sync, optimizer)
    start: float
    end: float


@dataclass
class Lane:
    label: str  # e.g. "p0 s1" (simulated stage) or "p0 s1 r3" (measured rank)
    pipeline: int
    stage: int
    spans: list[Span] = field(default_factory=list)
    peak_memory_gib: float | None = None  # measured lanes: the rank's peak memory at the step's end

    def busy(self, kind: str) -> float:
        return sum(s.end - s.start for s in self.spans if s.kind == kind)


@dataclass
class Timeline:
    title: str
    lanes: list[Lane]

    @property
    def makespan(self) -> float:
        return max((s.end for lane in self.lanes for s in lane.spans), default=0.0)


def _span(event: Any, path: str) -> Span:
    ev = expect_list(event, path)
    if len(ev) != 4 or ev[0] not in SPAN_KINDS or not all(isinstance(x, int | float) for x in ev[1:]):
        raise SpecError(path, f"expected [kind, micro_batch, start_s, end_s], got {event!r}",
                        f"kinds: {', '.join(SPAN_KINDS)}")
    return Span(ev[0], int(ev[1]), float(ev[2]), float(ev[3]))


def trace_timelines(data: Any) -> tuple[Plan, list[Timeline]]:
    """The plan and one timeline per traced step of a ``hexiscale.trace/1`` mapping."""
    data = expect_mapping(data, "")
    if data.get("format") != TRACE_FORMAT:
        raise SpecError("format", f"not a {TRACE_FORMAT} file", "pass a file written by 'hexiscale train --trace'")
    plan = plan_from_dict(data.get("plan"))
    ranks = plan.ranks()
    out = []
    for i, step in enumerate(expect_list(data.get("steps"), "steps")):
        step = expect_mapping(step, f"steps[{i}]")
        lanes = []
        for j, rec in enumerate(expect_list(step.get("ranks"), f"steps[{i}].ranks")):
            rec = expect_mapping(rec, f"steps[{i}].ranks[{j}]")
            r = rec.get("rank")
            if not isinstance(r, int) or not 0 <= r < len(ranks):
                raise SpecError(f"steps[{i}].ranks[{j}].rank", f"{r!r} is not a rank of the plan", "rewrite the trace")
            info = ranks[r]
            spans = [_span(ev, f"steps[{i}].ranks[{j}].events[{k}]")
                     for k, ev in enumerate(expect_list(rec.get("events"), f"steps[{i}].ranks[{j}].events"))]
            mem = rec.get("peak_memory_gib")
            if mem is not None and (not isinstance(mem, int | float) or isinstance(mem, bool)):
                raise SpecError(f"steps[{i}].ranks[{j}].peak_memory_gib", f"expected a number of GiB, got {mem!r}",
                                "rewrite the trace")
            lanes.append(Lane(f"p{info.pipeline} s{info.stage} r{r}", info.pipeline, info.stage, spans,
                              None if mem is None else float(mem)))
        out.append(Timeline(f"measured step {step.get('step')}", sorted(lanes, key=lambda ln: (ln.pipeline, ln.stage))))
    if not out:
        raise SpecError("steps", "the trace holds no step", "trace at least one step")
    return plan, out


def read_trace(path: str | Path) -> tuple[Plan, list[Timeline]]:
    """:func:`trace_timelines` of a trace file (errors name the file)."""
    data = load_json_file(path, "trace")
    try:
        return trace_timelines(data)
    except SpecError as exc:
        raise exc.with_file(str(path)) from None

"""``--plot DIR`` of ``hexiscale estimate`` and ``hexiscale show``: which PNGs go where, and the
text table of a timeline printed beside them."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from hexiscale.cli.output import console
from planner.cluster import ClusterSpec
from planner.plan import Plan
from planner.timeline import SPAN_KINDS, Timeline

PLAN_MAP = "plan-map.png"
SIMULATED = "timeline-simulated.png"
MEASURED = "timeline-measured.png"


def write_pictures(folder: str, plan: Plan, cluster: ClusterSpec | None, timeline: Timeline | None,
                   name: str = SIMULATED, subtitle: str = "") -> list[Path]:
    """The plan map and (given) the timeline as PNGs in ``folder``; prints their paths."""
    from hexiscale.plots.plan_map import plot_plan_map
    from hexiscale.plots.timeline import plot_timeline

    out = [plot_plan_map(plan, Path(folder) / PLAN_MAP, cluster)]
    if timeline is not None:
        out.append(plot_timeline(timeline, Path(folder) / name, subtitle))
    for p in out:
        console.print(f"wrote {p}", highlight=False)
    return out


def timeline_table(timeline: Timeline) -> Table:
    """Per lane: time in each kind of span and idle, in ms."""
    span = timeline.makespan
    table = Table(title=f"{timeline.title}: {span * 1e3:.2f} ms", title_justify="left")
    table.add_column("lane")
    for kind in (*SPAN_KINDS, "idle"):
        table.add_column(f"{kind.replace('_', ' ')} ms", justify="right")
    for lane in timeline.lanes:
        busy = [lane.busy(k) for k in SPAN_KINDS]
        table.add_row(lane.label, *(f"{b * 1e3:.2f}" for b in busy), f"{max(0.0, span - sum(busy)) * 1e3:.2f}")
    return table

"""The pipeline timeline: one row per stage (simulated) or rank (measured), time to the right.

Spans are coloured by kind (forward, backward, p2p, grad sync, optimizer; :mod:`.style`) and
forward/backward boxes carry their micro-batch number where they are wide enough; the grey
background is idle time. The right margin gives each row's idle share of the step.
"""

from __future__ import annotations

from pathlib import Path

from hexiscale.plots import finish, pyplot
from hexiscale.plots.style import IDLE, SPAN_COLOURS, SPAN_LABELS
from planner.timeline import SPAN_KINDS, Timeline

MIN_LABEL_WIDTH = 0.012  # of the step: narrower boxes get no micro-batch number


def plot_timeline(timeline: Timeline, path: str | Path, subtitle: str = "") -> Path:
    """Write ``timeline`` as a PNG to ``path``."""
    plt = pyplot()
    lanes = timeline.lanes
    span = timeline.makespan or 1.0
    unit, scale = ("s", 1.0) if span >= 1 else ("ms", 1e3)
    fig, ax = plt.subplots(figsize=(14, 1.8 + 0.34 * len(lanes)))
    n = len(lanes)
    for row, lane in enumerate(lanes):
        y = n - 1 - row
        ax.barh(y, span * scale, left=0, height=0.8, color=IDLE, edgecolor="none")
        for kind in SPAN_KINDS:
            spans = [s for s in lane.spans if s.kind == kind]
            ax.barh([y] * len(spans), [(s.end - s.start) * scale for s in spans],
                    left=[s.start * scale for s in spans], height=0.8, color=SPAN_COLOURS[kind], edgecolor="white",
                    linewidth=0.3)
        for s in lane.spans:
            if s.kind in ("forward", "backward") and (s.end - s.start) / span > MIN_LABEL_WIDTH:
                ax.text((s.start + s.end) / 2 * scale, y, str(s.micro_batch), ha="center", va="center", fontsize=6,
                        color="white")
        idle = 1 - sum(s.end - s.start for s in lane.spans) / span
        ax.text(span * scale * 1.005, y, f"idle {100 * max(0.0, idle):.0f}%", va="center", fontsize=7)
        if row and lanes[row - 1].pipeline != lane.pipeline:
            ax.axhline(y + 0.5, color="#555555", lw=0.8)
    ax.set_yticks(range(n), [ln.label for ln in reversed(lanes)], fontsize=7)
    ax.set_ylim(-0.6, n - 0.4)
    ax.set_xlim(0, span * scale * 1.07)
    ax.set_xlabel(f"time in the step ({unit})")
    ax.set_title(f"{timeline.title}: {span * scale:.3g} {unit}" + (f" - {subtitle}" if subtitle else ""), fontsize=10)
    legend = {SPAN_LABELS[k]: SPAN_COLOURS[k] for k in SPAN_KINDS}
    return finish(fig, [ax], {**legend, "idle": IDLE}, path, 0.05)

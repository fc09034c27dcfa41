"""Loading a file the user named that may be a cluster (YAML), a plan or a trace (JSON)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from planner.cluster import ClusterSpec, load_cluster
from planner.documents import load_json_text, read_user_text
from planner.errors import SpecError
from planner.plan import Plan, load_plan
from planner.timeline import TRACE_FORMAT, Timeline, read_trace


def sniff_kind(path: str) -> str:
    """'trace' for a JSON object of the trace format, 'plan' for one with ``pipelines``, else 'cluster'."""
    p = Path(path)
    if not p.exists():
        raise SpecError("", "no such file", "check the path", path)
    if p.suffix == ".json":
        try:
            data: Any = load_json_text(read_user_text(p, "plan"), path)
        except SpecError:
            return "plan"  # the plan loader reports it
        if isinstance(data, dict) and data.get("format") == TRACE_FORMAT:
            return "trace"
        return "plan" if isinstance(data, dict) and "pipelines" in data else "cluster"
    return "cluster"


def load_any(path: str) -> ClusterSpec | Plan | tuple[Plan, list[Timeline]]:
    """The cluster, the plan, or the plan and measured timelines of a trace."""
    kind = sniff_kind(path)
    if kind == "trace":
        return read_trace(path)
    return load_plan(path) if kind == "plan" else load_cluster(path)

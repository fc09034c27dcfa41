"""Loading a file the user named that may be a cluster (YAML) or a plan (JSON)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from planner.cluster import ClusterSpec, load_cluster
from planner.documents import load_json_text, read_user_text
from planner.errors import SpecError
from planner.plan import Plan, load_plan


def sniff_kind(path: str) -> str:
    """'plan' for a JSON object with a ``format`` key, else 'cluster'."""
    p = Path(path)
    if not p.exists():
        raise SpecError("", "no such file", "check the path", path)
    if p.suffix == ".json":
        try:
            data: Any = load_json_text(read_user_text(p, "plan"), path)
        except SpecError:
            return "plan"  # the plan loader reports it
        return "plan" if isinstance(data, dict) and "pipelines" in data else "cluster"
    return "cluster"


def load_any(path: str) -> ClusterSpec | Plan:
    return load_plan(path) if sniff_kind(path) == "plan" else load_cluster(path)

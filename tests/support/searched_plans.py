"""Plans produced by the search's finish (:meth:`planner.search.planner.Search.finish`) on a fixed
structure, small enough for the CPU oracle: the layouts the search places, proven trainable."""

from __future__ import annotations

from pathlib import Path

from planner.cluster import load_cluster
from planner.model import PRESETS
from planner.search import PlannerConfig, SearchResult
from planner.search.graph import make_units
from planner.search.oracle import Setting
from planner.search.planner import Search

DEMO = Path(__file__).resolve().parents[2] / "examples" / "clusters" / "demo-cpu-6.yaml"


def mixed_interleaved_search() -> SearchResult:
    """tiny-8l, global batch 10, on demo-cpu-6 as two pipelines, the A100s (2 stages) and the 4090s
    (4 stages), fp32 and ZeRO-1: the finish keeps interleaved 1F1B on the first (4 micro-batches)
    and 1F1B on the second (6 micro-batches, not a multiple of its 4 stages)."""
    cluster = load_cluster(DEMO)
    search = Search(cluster, PRESETS["tiny-8l"], 10, PlannerConfig(local_search=False, dtype="fp32"))
    units = make_units(cluster, {"a100": 1, "r4090": 1}, "fp32")
    cand = search.evaluate([units[:2], units[2:]], Setting(1, "none", 1, "1f1b", "fp32"))
    return search.finish([cand])

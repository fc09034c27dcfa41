"""Plans produced by the search's finish (:meth:`planner.search.planner.Search.finish`: ILP batch
split, schedule twins, full estimate, layer polish) on a fixed structure, small enough for the
oracles: the layouts the search places, proven trainable."""

from __future__ import annotations

from pathlib import Path

from planner.cluster import load_cluster
from planner.model import PRESETS
from planner.search import PlannerConfig, SearchResult
from planner.search.graph import make_units
from planner.search.oracle import Setting
from planner.search.planner import Search

DEMO = Path(__file__).resolve().parents[2] / "examples" / "clusters" / "demo-cpu-6.yaml"


def searched(pipelines: list[list[int]], batch: int, zero: int = 1) -> SearchResult:
    """tiny-8l in fp32 on demo-cpu-6, pipelines of its one-GPU stages (0-1: the A100s, 2-5: the
    4090s, in that order), finished by the search from the 1F1B candidate with ZeRO ``zero``."""
    cluster = load_cluster(DEMO)
    search = Search(cluster, PRESETS["tiny-8l"], batch, PlannerConfig(local_search=False, dtype="fp32"))
    units = make_units(cluster, {"a100": 1, "r4090": 1}, "fp32")
    cand = search.evaluate([[units[i] for i in p] for p in pipelines], Setting(1, "none", zero, "1f1b", "fp32"))
    return search.finish([cand])


def mixed_interleaved_search() -> SearchResult:
    """Global batch 10 on the A100s (2 stages) and the 4090s (4 stages): the finish keeps interleaved
    1F1B on the first (4 micro-batches) and 1F1B on the second (6, not a multiple of its 4 stages)."""
    return searched([[0, 1], [2, 3, 4, 5]], 10)

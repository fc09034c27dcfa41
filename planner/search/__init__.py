"""The planner's search: device graph, METIS pipelines, stages, exact refinement (DP + ILP),
local search, baselines and an exhaustive enumerator for small clusters.

Entry point: :func:`planner.search.planner.make_plan` (re-exported here)."""

from planner.search.planner import PlannerConfig, SearchResult, make_plan, search

__all__ = ["PlannerConfig", "SearchResult", "make_plan", "search"]

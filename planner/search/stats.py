"""Deterministic work counters of one search (:class:`SearchStats`).

Wall and CPU time depend on the machine; these counts do not. They are what a test can hold
against a budget to catch a regression in the search's work (issue 31: a per-stage scan of every
pipeline made the refinement ``pipelines^2 x layers``), and what ``hexiscale plan --explain``
prints next to the time."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SearchStats:
    """What one search did, counted where it is done (not timed)."""

    candidates: int = 0  # structures refined and priced under a setting (Search.evaluate, cache misses)
    refinements: int = 0  # candidate.evaluate calls, the finalists' ILP re-splits and re-refinements included
    oracle_calls: int = 0  # Oracle.stage_cost calls (one per stage priced)
    oracle_misses: int = 0  # of which priced by the cost model (not from the oracle's caches)
    partial_params: int = 0  # passes over a plan for the shards cut into sync slices (planner.cost.memory)
    estimates: int = 0  # full planner.cost.estimate calls (finalists and layer polish)

    def line(self) -> str:
        return (f"{self.candidates} candidates, {self.refinements} refinements, {self.oracle_calls} oracle calls "
                f"({self.oracle_misses} priced), {self.partial_params} cut-shard passes, {self.estimates} full "
                "estimates")

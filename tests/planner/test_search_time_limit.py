"""``time_limit_s`` is wall time for the whole search, the finish included (issue 31: a 30 s limit
ran 332 s), tested with a fake clock: nothing is timed. Past the limit the search returns the best
plan so far, says so, and starts no new work: no new structure, no ILP, one full estimate, no
layer polish."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from planner.cluster import load_cluster
from planner.model import PRESETS
from planner.search import PlannerConfig, search
from planner.validate import validate

CLUSTER = Path(__file__).resolve().parents[2] / "examples" / "clusters" / "seed-uneven-nodes.yaml"
MODEL = replace(PRESETS["llama-1.3b"], seq_len=1024)


class FakeClock:
    """Seconds that advance by ``step`` at every reading; counts the readings past ``deadline``."""

    def __init__(self, step: float, deadline: float):
        self.t, self.step, self.deadline, self.late = 0.0, step, deadline, 0

    def __call__(self) -> float:
        self.t += self.step
        self.late += self.t > self.deadline
        return self.t


def test_time_limit_cuts_the_whole_search_and_returns_the_best_so_far() -> None:
    cluster = load_cluster(CLUSTER)
    config = PlannerConfig(time_limit_s=20.0, max_evaluations=10_000)
    clock = FakeClock(1.0, 20.0)
    result = search(cluster, MODEL, 16, config=config, clock=clock, started=0.0)
    assert result.cut_short
    assert "cut short" in result.log[-1] and "best plan found so far" in result.log[-1]
    validate(result.plan, cluster)
    assert result.estimate.fits
    # past the limit every phase stops at its first clock reading (every new candidate reads the
    # clock first): a handful of readings, not a sweep's or a local search's worth
    assert clock.late <= 12, clock.late
    assert result.stats.estimates == 1  # the first finalist that fits; the others and the polish skipped
    assert not any(line.startswith("layer polish") for line in result.log)


def test_a_limit_spent_before_the_search_still_returns_a_plan() -> None:
    cluster = load_cluster(CLUSTER)
    clock = FakeClock(0.0, -1.0)  # always past the deadline
    result = search(cluster, MODEL, 16, config=PlannerConfig(time_limit_s=1.0), clock=clock, started=-100.0)
    assert result.cut_short and result.stats.candidates >= 1
    validate(result.plan, cluster)
    uncut = search(cluster, MODEL, 16, config=PlannerConfig(time_limit_s=3600.0, max_evaluations=300))
    assert uncut.estimate.step_time_s <= result.estimate.step_time_s * (1 + 1e-9)

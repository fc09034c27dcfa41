"""What the recorded-fidelity tests share: a run of :mod:`benchmarks.planner.fidelity` priced again
with today's model from its own host calibrations (:mod:`benchmarks.planner.fidelity_repredict`), and
the checks each run's test holds it to (per plan within its recorded error plus a margin, memory,
issue 32's bar)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks.planner.fidelity_repredict import repredict

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
MEMORY_UNDER = -0.05  # memory never under-predicted by more than 5 % (issue 32)


def repriced(run: str) -> dict[str, dict[str, Any]]:
    """The plans of ``benchmarks/results/<run>`` priced again, by name."""
    return {r["plan"]: r for r in repredict(RESULTS / run)}


def assert_within_recorded(rows: dict[str, dict[str, Any]], name: str, recorded: dict[str, float],
                           margin: float) -> None:
    """``name``'s error no further from its measurement than its recorded error plus ``margin``."""
    err, was = rows[name]["time_err"], recorded[name]
    assert abs(err) <= abs(was) + margin, f"{name}: {err:+.3f} (recorded {was:+.3f})"


def memory_errors(rows: dict[str, dict[str, Any]]) -> list[float]:
    """Every GPU's predicted/measured memory - 1 over the run's plans."""
    return [m["err"] for r in rows.values() for m in r["memory"]]


def meets_issue_32_bar(rows: dict[str, dict[str, Any]]) -> bool:
    """Mean |step-time error| <= 5 %, worst <= 10 %, packed plans within 10 % (issue 32's bar)."""
    errs = [abs(r["time_err"]) for r in rows.values()]
    packed = [abs(r["time_err"]) for r in rows.values() if r["packed"]] or [0.0]
    return sum(errs) / len(errs) <= 0.05 and max(errs) <= 0.10 and max(packed) <= 0.10


def recorded_tests(run: str, recorded: dict[str, float], margin: float, gpu_figures: int) -> tuple[Any, ...]:
    """The tests every recorded run gets, to bind at module level of its test file::

        rows, test_every_recorded_plan_is_priced, test_plan_error_within_recorded, \\
            test_memory_is_never_under_predicted_by_more_than_5_percent = recorded_tests(RUN, RECORDED, MARGIN, 32)

    (``rows``: the module's fixture of the run priced again; ``gpu_figures``: plans x GPUs with memory.)"""

    @pytest.fixture(scope="module")
    def rows() -> dict[str, dict[str, Any]]:
        return repriced(run)

    def test_every_recorded_plan_is_priced(rows: dict[str, dict[str, Any]]) -> None:
        assert sorted(rows) == sorted(recorded) and all("time_err" in r for r in rows.values())

    @pytest.mark.parametrize("name", sorted(recorded))
    def test_plan_error_within_recorded(rows: dict[str, dict[str, Any]], name: str) -> None:
        assert_within_recorded(rows, name, recorded, margin)

    def test_memory_is_never_under_predicted_by_more_than_5_percent(rows: dict[str, dict[str, Any]]) -> None:
        errs = memory_errors(rows)
        assert len(errs) == gpu_figures and min(errs) >= MEMORY_UNDER

    return (rows, test_every_recorded_plan_is_priced, test_plan_error_within_recorded,
            test_memory_is_never_under_predicted_by_more_than_5_percent)

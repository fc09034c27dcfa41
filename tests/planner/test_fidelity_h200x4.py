"""The cost model held to what the fidelity program measured on a fresh 4x H200 host on 2026-11-27
(``benchmarks/results/fidelity_h200x4_20261127T124458Z.json``, its first half, ``--part 1/2``: 8
plans, calibrated in the same run, the MPS share included), priced again from that run's own host
calibrations (:mod:`benchmarks.planner.fidelity_repredict`).

``RECORDED`` is each plan's predicted/measured - 1 with the model of this test's commit; a change
that moves a plan more than ``MARGIN`` further from its measurement fails here. Known misses (issue
32): the packed row under-predicted by 18 % (its bottleneck GPU's forward and backward: 282.7 ms traced
for 215 predicted; GPU 3, with the same documents, 243.7; its gradient sync 5.6 ms), TP 2 x DP 2
under MPS by 7.9 % (its forward, ~500 ms on both TP pairs; 15.1 % before the share's layer was bounded
by its full GPU's, :mod:`planner.cost.measured` rule 7), the 7B four-stage pipeline over-predicted by 11 %
(its layer priced by the fitted roofline 9-11 % over this host's own timing of the 7B layer)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks.planner.fidelity_repredict import repredict

RUN = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "fidelity_h200x4_20261127T124458Z.json"
RECORDED = {"planner-1.3b-gb32": 0.033, "1.3b-tp4-m4": 0.051, "packed-1.3b-dp4": -0.183, "7b-pp4-m8": 0.115,
            "7b-tp2xpp2-m8": 0.036, "mps-1.3b-dp4-even": 0.029, "mps-1.3b-tp2xdp2": -0.079,
            "mps-13b-tp2-tp2-full": 0.014}
MARGIN = 0.03


@pytest.fixture(scope="module")
def rows() -> dict[str, dict[str, Any]]:
    return {r["plan"]: r for r in repredict(RUN)}


def test_every_recorded_plan_is_priced(rows: dict[str, dict[str, Any]]) -> None:
    assert sorted(rows) == sorted(RECORDED) and all("time_err" in r for r in rows.values())


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_plan_error_within_recorded(rows: dict[str, dict[str, Any]], name: str) -> None:
    err, recorded = rows[name]["time_err"], RECORDED[name]
    assert abs(err) <= abs(recorded) + MARGIN, f"{name}: {err:+.3f} (recorded {recorded:+.3f})"


def test_memory_is_never_under_predicted_by_more_than_5_percent(rows: dict[str, dict[str, Any]]) -> None:
    errs = [m["err"] for r in rows.values() for m in r["memory"]]
    assert len(errs) == 32 and min(errs) >= -0.05


@pytest.mark.xfail(strict=True, reason="issue 32: mean |error| 6.7 %, worst 18.3 % (packed) on this run")
def test_issue_32_bar(rows: dict[str, dict[str, Any]]) -> None:
    errs = [abs(r["time_err"]) for r in rows.values()]
    packed = [abs(r["time_err"]) for r in rows.values() if r["packed"]]
    assert sum(errs) / len(errs) <= 0.05 and max(errs) <= 0.10 and max(packed) <= 0.10


def test_a_run_without_its_home_is_refused_in_one_line(tmp_path: Path) -> None:
    from benchmarks.planner.fidelity_repredict import main

    with pytest.raises(SystemExit, match="no file"):
        main([str(tmp_path / "missing.json")])
    lone = tmp_path / "run.json"
    lone.write_text(RUN.read_text())
    with pytest.raises(SystemExit, match="no host home"):
        main([str(lone)])

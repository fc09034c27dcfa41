"""The cost model held to llama-1.3b at 64K context, one sequence a step, measured on 4x H100 on
2026-11-27 with the blockwise CP attention on cuDNN (``benchmarks/executor/long_context.py
--global-batch-size 1``), every plan priced as its run priced it: that host's calibration and
profile, measured by ``hexiscale calibrate`` on the same machine just before each run
(benchmarks/results/calibrations/; ``cp_attention_efficiency`` is timed there at 32K over 2 ranks,
not fitted to these plans).

* 06:31 UTC (long_context_cuda_20261127T063113Z.json): six layouts. That run's engine kept whole
  Adam state in a lone pipeline, so its lone plans are priced with ZeRO off, as they ran.
* 06:46 UTC (long_context_cuda_20261127T064654Z.json): the final executor, ZeRO-1 over the CP
  slots of the lone cp4 stage (planner.state_layout.zero_sharded).

``RECORDED`` is each plan's predicted/measured - 1 with the model of this test's commit; a change
that moves a plan more than ``MARGIN`` further from its measurement fails here. Issue 35's target
(within 10 %) holds for the planner's CP plan and the fastest plan without CP in both runs; pp4
(one sequence through 4 stages, 3.9 s) is 21 % under and recorded as it is."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from _calibration_home import RESULTS, calibration_home

from benchmarks.fidelity.host4 import cluster_for
from planner.calibration.local import resolve_profiles
from planner.cost import estimate
from planner.plan import plan_from_dict

MARGIN = 0.03
UNDER = 0.05  # issue 32: memory never under-predicted by more than this


@dataclass(frozen=True)
class Run:
    json: str
    calibration: str  # stem under benchmarks/results/calibrations (.json and .device.json)
    lone_zero_off: bool  # that run's engine kept whole Adam state in a lone pipeline
    recorded: dict[str, float]


RUNS = {
    "0631": Run("long_context_cuda_20261127T063113Z.json", "h100-sxm-measured_20261127T0629Z", True,
                {"planner": -0.054, "cp2xtp2": 0.056, "tp4-full": -0.001, "tp2xpp2": -0.097, "pp4": -0.206}),
    "0646": Run("long_context_cuda_20261127T064654Z.json", "h100-sxm-measured_20261127T0645Z", False,
                {"planner": -0.031, "cp2xtp2-full": 0.071, "tp4-full": -0.022}),
}
CASES = [(run, plan) for run, r in RUNS.items() for plan in sorted(r.recorded)]


def _price(run: Run, home: Path) -> dict[str, tuple[float, float, dict]]:
    """plan -> (time error, memory error, row)."""
    with calibration_home(run.calibration, home):
        cluster = cluster_for((100,) * 4, "h100-sxm-measured", cpu=False)
        profiles = resolve_profiles(cluster).profiles
        out = {}
        for r in json.loads((RESULTS / run.json).read_text())["rows"]:
            if r.get("measured_s"):
                plan = plan_from_dict(r["layout"])
                if run.lone_zero_off and len(plan.pipelines) == 1:
                    plan = replace(plan, options=replace(plan.options, zero=0))
                est = estimate(plan, cluster, profiles)
                mem = max(m.required_gib for m in est.memory.values())
                out[r["plan"]] = (est.step_time_s / r["measured_s"] - 1, mem / r["measured_peak_gib"] - 1, r)
        return out


@pytest.fixture(scope="module")
def priced(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, tuple[float, float, dict]]]:
    return {name: _price(run, tmp_path_factory.mktemp(f"home{name}")) for name, run in RUNS.items()}


@pytest.mark.parametrize("run", sorted(RUNS))
def test_every_measured_plan_is_priced(priced: dict, run: str) -> None:
    assert sorted(priced[run]) == sorted(RUNS[run].recorded)
    row = priced[run]["planner"][2]
    assert row["uses_cp"] and row["cp"] == "4"


@pytest.mark.parametrize(("run", "name"), CASES)
def test_plan_error_within_recorded(priced: dict, run: str, name: str) -> None:
    err, recorded = priced[run][name][0], RUNS[run].recorded[name]
    assert abs(err) <= abs(recorded) + MARGIN, f"{run} {name}: {err:+.3f} (recorded {recorded:+.3f})"


@pytest.mark.parametrize("run", sorted(RUNS))
def test_the_cp_plan_and_the_best_plan_without_cp_within_ten_percent(priced: dict, run: str) -> None:
    """Issue 35's target: the planner's CP plan, and the fastest measured plan without CP."""
    rows = priced[run]
    no_cp = min((r["measured_s"], name) for name, (_, _, r) in rows.items() if not r["uses_cp"])[1]
    assert no_cp == "tp4-full"
    assert abs(rows["planner"][0]) <= 0.10 and abs(rows[no_cp][0]) <= 0.10


@pytest.mark.parametrize(("run", "name"), CASES)
def test_measured_peak_is_not_under_predicted(priced: dict, run: str, name: str) -> None:
    assert priced[run][name][1] >= -UNDER, priced[run][name][:2]

"""The cost model held to llama-1.3b at 64K context, one sequence a step, measured on 4x H100 on
2026-11-27 06:31 UTC with the blockwise CP attention on cuDNN
(benchmarks/results/long_context_cuda_20261127T063113Z.json, ``benchmarks/executor/long_context.py
--global-batch-size 1``), every plan priced as that run priced it: this host's calibration and
profile, measured by ``hexiscale calibrate`` on the same machine just before
(benchmarks/results/calibrations/h100-sxm-measured_20261127T0629Z*.json; its
``cp_attention_efficiency`` timed at 32K over 2 ranks, not fitted to these plans).

``RECORDED`` is each plan's predicted/measured - 1 with the model of this test's commit; a change
that moves a plan more than ``MARGIN`` further from its measurement fails here. Issue 35's target
(within 10 %) holds for the planner's CP plan and the fastest plan without CP; pp4 (one sequence
through 4 stages, 3.9 s) is 21 % under and recorded as it is."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks.fidelity.host4 import cluster_for
from planner.calibration.local import resolve_profiles
from planner.catalog import _cached
from planner.cost import estimate
from planner.plan import plan_from_dict

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
RUN = RESULTS / "long_context_cuda_20261127T063113Z.json"
CALIBRATION = RESULTS / "calibrations" / "h100-sxm-measured_20261127T0629Z.json"
DEVICE = RESULTS / "calibrations" / "h100-sxm-measured_20261127T0629Z.device.json"
RECORDED = {"planner": -0.054, "cp2xtp2": 0.056, "tp4-full": -0.001, "tp2xpp2": -0.097, "pp4": -0.206}
MARGIN = 0.03
UNDER = 0.05  # issue 32: memory never under-predicted by more than this


@pytest.fixture(scope="module")
def priced(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[float, float, dict]]:
    """plan -> (time error, memory error, row)."""
    home = tmp_path_factory.mktemp("home")
    for src, sub in ((CALIBRATION, "calibration"), (DEVICE, "devices")):
        (home / sub).mkdir()
        shutil.copy(src, home / sub / "h100-sxm-measured.json")
    mp = pytest.MonkeyPatch()
    mp.setenv("HEXISCALE_HOME", str(home))
    _cached.cache_clear()
    try:
        cluster = cluster_for((100,) * 4, "h100-sxm-measured", cpu=False)
        profiles = resolve_profiles(cluster).profiles
        out = {}
        for r in json.loads(RUN.read_text())["rows"]:
            if r.get("measured_s"):
                plan = plan_from_dict(r["layout"])
                if len(plan.pipelines) == 1:  # that run's engine sharded over pipelines only: priced as it ran
                    plan = replace(plan, options=replace(plan.options, zero=0))
                est = estimate(plan, cluster, profiles)
                mem = max(m.required_gib for m in est.memory.values())
                out[r["plan"]] = (est.step_time_s / r["measured_s"] - 1, mem / r["measured_peak_gib"] - 1, r)
        return out
    finally:
        mp.undo()
        _cached.cache_clear()


def test_every_measured_plan_is_priced(priced: dict[str, tuple[float, float, dict]]) -> None:
    assert sorted(priced) == sorted(RECORDED)
    assert priced["planner"][2]["uses_cp"] and priced["planner"][2]["cp"] == "4"


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_plan_error_within_recorded(priced: dict[str, tuple[float, float, dict]], name: str) -> None:
    err, recorded = priced[name][0], RECORDED[name]
    assert abs(err) <= abs(recorded) + MARGIN, f"{name}: {err:+.3f} (recorded {recorded:+.3f})"


def test_the_cp_plan_and_the_best_plan_without_cp_within_ten_percent(
        priced: dict[str, tuple[float, float, dict]]) -> None:
    """Issue 35's target: the planner's CP plan, and the fastest measured plan without CP."""
    no_cp = min((r["measured_s"], name) for name, (_, _, r) in priced.items() if not r["uses_cp"])[1]
    assert no_cp == "tp4-full"
    assert abs(priced["planner"][0]) <= 0.10 and abs(priced[no_cp][0]) <= 0.10


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_measured_peak_is_not_under_predicted(priced: dict[str, tuple[float, float, dict]], name: str) -> None:
    assert priced[name][1] >= -UNDER, priced[name][:2]

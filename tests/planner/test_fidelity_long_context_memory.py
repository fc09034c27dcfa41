"""The memory model held to the peaks measured on 4x H100 at 64K context (llama-1.3b, global batch
4, bf16; benchmarks/results/long_context_cuda_20261127T042301Z.json, benchmarks/executor/long_context.py,
2026-11-27 04:23 UTC), each plan priced as that run priced it (the measured H100 profile and the
packaged 'h100' calibration). A measured peak is the allocator's peak reserve + the communicators
+ one CUDA context per process (benchmarks/fidelity/accuracy.device_memory).

Issue 32's bar is memory never under-predicted by more than 5 %. The CP plan with full recompute
misses it (``KNOWN_MISS``: what the CPU counts of tests/executor/test_cp_memory.py explain is in;
the rest is only seen on the GPU): it may not get worse, and its strict test turns green when fixed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.fidelity.host4 import cluster_for
from planner.calibration.local import resolve_profiles
from planner.catalog import _cached
from planner.cost import estimate
from planner.plan import plan_from_dict

RUN = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "long_context_cuda_20261127T042301Z.json"
UNDER = 0.05  # issue 32: never under-predicted by more than this
KNOWN_MISS = {"cp4-full": -0.153}  # predicted / measured - 1 with the model of this test's commit
MARGIN = 0.02
# the planner's plan (cp4, no recompute) ran out of memory asking for 1.95 GiB with 77.39 GiB in use
OOM_AT_LEAST_GIB = 77.39 + 1.95


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[float, dict]]:
    mp = pytest.MonkeyPatch()
    mp.setenv("HEXISCALE_HOME", str(tmp_path_factory.mktemp("home")))  # the packaged calibration only
    _cached.cache_clear()
    try:
        cluster = cluster_for((100,) * 4, "h100-sxm-measured", cpu=False)
        profiles = resolve_profiles(cluster).profiles
        out = {}
        for row in json.loads(RUN.read_text())["rows"]:
            if row["status"] == "measured" or row["status"].startswith("OOM"):
                est = estimate(plan_from_dict(row["layout"]), cluster, profiles)
                out[row["plan"]] = (max(m.required_gib for m in est.memory.values()), row)
        return out
    finally:
        mp.undo()
        _cached.cache_clear()


def test_the_recorded_plans_are_priced(rows: dict[str, tuple[float, dict]]) -> None:
    assert sorted(rows) == ["cp2xtp2-full", "cp4-full", "dp4-full", "planner", "tp2xdp2-full"]


def test_the_plan_that_ran_out_of_memory_is_predicted_over_the_card(rows: dict[str, tuple[float, dict]]) -> None:
    predicted, row = rows["planner"]
    assert row["status"] == "OOM (measured)"
    assert predicted > row["capacity_gib"] and predicted >= OOM_AT_LEAST_GIB


@pytest.mark.parametrize("name", ["cp2xtp2-full", "dp4-full", "tp2xdp2-full"])
def test_measured_peak_is_not_under_predicted(rows: dict[str, tuple[float, dict]], name: str) -> None:
    predicted, row = rows[name]
    assert predicted / row["measured_peak_gib"] - 1 >= -UNDER, (predicted, row["measured_peak_gib"])


@pytest.mark.parametrize("name", sorted(KNOWN_MISS))
def test_known_miss_gets_no_worse(rows: dict[str, tuple[float, dict]], name: str) -> None:
    predicted, row = rows[name]
    assert predicted / row["measured_peak_gib"] - 1 >= KNOWN_MISS[name] - MARGIN, (predicted, row["measured_peak_gib"])


@pytest.mark.xfail(strict=True, reason="issue 32: CP with full recompute under-predicted (GPU-only remainder)")
@pytest.mark.parametrize("name", sorted(KNOWN_MISS))
def test_known_miss_meets_the_bar(rows: dict[str, tuple[float, dict]], name: str) -> None:
    predicted, row = rows[name]
    assert predicted / row["measured_peak_gib"] - 1 >= -UNDER

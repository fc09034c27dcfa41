"""The memory model held to the peaks measured on 4x H100 at 64K context (llama-1.3b, global batch
4, bf16; benchmarks/results/long_context_cuda_20261127T042301Z.json, benchmarks/executor/long_context.py,
2026-11-27 04:23 UTC), each plan priced as that run priced it (the measured H100 profile and the
packaged 'h100' calibration). A measured peak is the allocator's peak reserve + the communicators
+ one CUDA context per process (benchmarks/fidelity/accuracy.device_memory).

Issue 32's bar is memory never under-predicted by more than 5 %. Its dense plans are held here; its
CP plans ran the masked CP attention (the gathered K/V saved whole), which bf16 CUDA no longer runs:
the blockwise path's peaks are held in tests/planner/test_fidelity_long_context_cp.py."""

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
OVER = 0.05  # nor the over-estimate that summed the loss's and the recomputed layer's transients (+10-14 %)
DENSE = ("dp4-full", "tp2xdp2-full")


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
            if row["plan"] in DENSE:
                est = estimate(plan_from_dict(row["layout"]), cluster, profiles)
                out[row["plan"]] = (max(m.required_gib for m in est.memory.values()), row)
        return out
    finally:
        mp.undo()
        _cached.cache_clear()


def test_the_recorded_plans_are_priced(rows: dict[str, tuple[float, dict]]) -> None:
    assert sorted(rows) == sorted(DENSE)


@pytest.mark.parametrize("name", DENSE)
def test_measured_peak_is_not_under_predicted(rows: dict[str, tuple[float, dict]], name: str) -> None:
    predicted, row = rows[name]
    assert predicted / row["measured_peak_gib"] - 1 >= -UNDER, (predicted, row["measured_peak_gib"])


@pytest.mark.parametrize("name", DENSE)
def test_measured_peak_is_not_over_predicted(rows: dict[str, tuple[float, dict]], name: str) -> None:
    predicted, row = rows[name]
    assert predicted / row["measured_peak_gib"] - 1 <= OVER, (predicted, row["measured_peak_gib"])

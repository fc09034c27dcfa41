"""The micro-batch choice checked against measured peak memory (issue 32): an MPS share's memory is
priced from the activation bytes ``hexiscale calibrate`` measured on the full GPU of the same base
(:meth:`planner.cost.ProfileSet.memory_twin`), not from the shipped share profile's older rows, which
over-predicted the slow GPUs and refused micro-batches that fit. Held to a recorded run: 2x H200,
2026-11-26 (``benchmarks/results/fidelity_host2_h200_20261126T174616Z.json``), where the MPS GPU of
``mps-1.3b-dp2-12-4`` was predicted 9.4 % over what it measured."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.fidelity.repredict import home_files, repredict
from planner.catalog import default_catalog
from planner.cost import ProfileSet

RUN = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "fidelity_host2_h200_20261126T174616Z.json"


def test_mps_devices_are_priced_within_5_percent_of_their_recorded_peak() -> None:
    results = json.loads(RUN.read_text())
    rows = {r["plan"]: r for r in repredict(results, home_files(results, RUN.with_suffix(".home.json")))}
    slow = [m for name in ("mps-1.3b-dp2-12-4", "mps-1.3b-pp2-fast-first") for m in rows[name]["memory"]
            if m["device"] == "g1:0"]
    assert len(slow) == 2
    for m in slow:
        assert abs(m["predicted_gib"] / m["measured_gib"] - 1) <= 0.05, m
    errs = [m["err"] for r in rows.values() for m in r["memory"]]
    assert min(errs) >= -0.05  # never under by more than 5 %


def test_without_a_fused_full_sm_entry_a_share_keeps_its_own_rows() -> None:
    profiles = ProfileSet(default_catalog())  # the packaged entries only (tests' empty host home)
    for key in ("h100-sxm-mps50", "h200-mps50"):
        assert profiles.memory_twin(profiles.catalog.get(key)) is None
        assert profiles.get(key).memory is None  # type: ignore[attr-defined]

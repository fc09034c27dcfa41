"""The cost model held to the 4x H100 bubbles run of 2026-11-27 09:22 UTC, issue 35's bubble target
(benchmarks/results/bubbles_h100_20261127T092217Z.json: llama-1.3b seq 2048 on MPS 100/100/50/50,
8 micro-batches of 2, bf16). The split, 8/8/5/3 layers, is the benchmark's own: the planner's
polish under this host's measured speeds, the 50 % share calibrated just before by
``hexiscale calibrate --sm-percent 50`` (09:21) beside the whole GPU's calibration of 06:45
(benchmarks/results/calibrations/). Measured there: ZB-H1 cut the mean bubble 34.1 % against
1F1B (98.9 -> 65.2 ms) at the same peak memory (20.26 GiB both).

Priced as that run priced it (:func:`benchmarks.executor.bubbles.predicted`), the model must keep
the step and schedule within issue 35's 10 %, the mean bubble within 10 %, each rank's tensors
within issue 32's 5 %, and predict a cut of 30 % or more itself (it did: 34 %)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _calibration_home import RESULTS, calibration_home

from benchmarks.executor.bubbles import predicted
from planner.cluster import load_cluster
from planner.plan import plan_from_dict

RUN = RESULTS / "bubbles_h100_20261127T092217Z.json"
CLUSTER = Path(__file__).resolve().parents[2] / "examples" / "clusters" / "h100x4-mps-100-100-50-50.yaml"
HOME = {"h100-sxm-measured": "h100-sxm-measured_20261127T0645Z",
        "h100-sxm-mps50-measured": "h100-sxm-mps50-measured_20261127T0921Z"}
TIME = 0.10  # issue 35: the model predicts within 10 %
MEMORY = 0.05  # issue 32: memory within 5 %
CUT = 0.30  # issue 35: the bubble cut against 1F1B


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(measured row, prediction) per setting, 1F1B first."""
    with calibration_home(HOME, tmp_path_factory.mktemp("home")):
        data = json.loads(RUN.read_text())
        cluster = load_cluster(CLUSTER)
        return [(row, predicted(plan_from_dict(plan), cluster))
                for plan, row in zip(data["plans"], data["rows"], strict=True)]


def test_the_run_is_the_balanced_split_with_measured_speeds(rows: list) -> None:
    data = json.loads(RUN.read_text())
    assert data["layers_per_stage"] == [8, 8, 5, 3] and not data["layers_pinned"]
    assert data["profiles"] == {"h100-sxm": "h100-sxm-measured", "h100-sxm-mps50": "h100-sxm-mps50-measured"}
    assert [r["schedule"] for r, _ in rows] == ["1f1b", "zb-h1"]


@pytest.mark.parametrize("setting", [0, 1])
def test_step_schedule_and_bubble_within_ten_percent(rows: list, setting: int) -> None:
    row, pred = rows[setting]
    meas = row["measured"]
    assert abs(pred["step_s"] / meas["step_s"] - 1) <= TIME
    assert abs(pred["schedule_s"] / meas["schedule_s"] - 1) <= TIME
    assert abs(_mean(pred["bubble_s"]) / _mean(meas["bubble_s"]) - 1) <= TIME


@pytest.mark.parametrize("setting", [0, 1])
def test_rank_tensors_within_five_percent(rows: list, setting: int) -> None:
    row, pred = rows[setting]
    for rank, (p, m) in enumerate(zip(pred["tensor_gib"], row["measured"]["memory_gib"], strict=True)):
        assert abs(p / m - 1) <= MEMORY, (row["schedule"], rank, p, m)


def test_zb_h1_cuts_the_bubble_thirty_percent_at_the_same_memory(rows: list) -> None:
    (base, base_pred), (zb, zb_pred) = rows
    measured_cut = 1 - _mean(zb["measured"]["bubble_s"]) / _mean(base["measured"]["bubble_s"])
    predicted_cut = 1 - _mean(zb_pred["bubble_s"]) / _mean(base_pred["bubble_s"])
    assert measured_cut >= CUT and predicted_cut >= CUT, (measured_cut, predicted_cut)
    assert max(zb["measured"]["memory_gib"]) <= 1.05 * max(base["measured"]["memory_gib"])
    assert max(zb_pred["tensor_gib"]) <= 1.05 * max(base_pred["tensor_gib"])

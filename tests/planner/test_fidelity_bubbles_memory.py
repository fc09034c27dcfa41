"""The memory model held to the 4x H100 bubbles run of 2026-11-27 06:49 UTC
(benchmarks/results/bubbles_h100_20261127T064953Z.json: llama-1.3b seq 2048, stages of 9/8/4/3
layers on MPS 100/100/50/50, 8 micro-batches of 2, 1F1B and ZB-H1, bf16 with the engine's cast-once
weights), priced as that run priced it: the host calibration ``hexiscale calibrate`` wrote at 06:45
(benchmarks/results/calibrations/; with the model before issue 32 this reproduces the run's printed
"predicted tensors" to the MiB).

Per rank, ``max_memory_allocated`` against the model's tensors (``total - overhead``: no CUDA
context, workspaces, communicators or fragmentation; ``benchmarks.executor.bubbles.predicted``).
Charging the bf16 weight copies per micro-batch in flight put rank 0 10.5 % over (25.02 predicted,
22.63 measured); one copy per stage puts every rank within 4 % under (issue 32: never more than 5 %)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _calibration_home import RESULTS, calibration_home

from benchmarks.executor.bubbles import predicted
from planner.cluster import load_cluster
from planner.plan import plan_from_dict

RUN = RESULTS / "bubbles_h100_20261127T064953Z.json"
CLUSTER = Path(__file__).resolve().parents[2] / "examples" / "clusters" / "h100x4-mps-100-100-50-50.yaml"
UNDER = 0.05  # issue 32: never under-predicted by more than this
OVER = 0.05  # and no longer the over-estimate that held micro-batches back


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, int, float, float]]:
    """(schedule, rank, predicted tensor GiB, measured GiB) of every rank of both settings."""
    with calibration_home("h100-sxm-measured_20261127T0645Z", tmp_path_factory.mktemp("home")):
        data = json.loads(RUN.read_text())
        cluster = load_cluster(CLUSTER)
        out = []
        for plan, row in zip(data["plans"], data["rows"], strict=True):
            pred: dict[str, Any] = predicted(plan_from_dict(plan), cluster)
            out += [(row["schedule"], i, p, m)
                    for i, (p, m) in enumerate(zip(pred["tensor_gib"], row["measured"]["memory_gib"], strict=True))]
        return out


def test_both_schedules_every_rank(ranks: list[tuple[str, int, float, float]]) -> None:
    assert [(s, i) for s, i, _, _ in ranks] == [(s, i) for s in ("1f1b", "zb-h1") for i in range(4)]


@pytest.mark.parametrize("index", range(8))
def test_rank_tensors_within_five_percent(ranks: list[tuple[str, int, float, float]], index: int) -> None:
    schedule, rank, pred, meas = ranks[index]
    assert -UNDER <= pred / meas - 1 <= OVER, (schedule, rank, pred, meas)

"""The fidelity plan's traced step summed by kind: what the step's time went to, including the time
no span covers (the device waiting on the host between and around the spans)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.fidelity.traced_step import span_totals


def test_spans_summed_by_kind_with_the_uncovered_time() -> None:
    events = [["forward", 0, 0.000, 0.010], ["forward", 1, 0.012, 0.022], ["backward", 1, 0.022, 0.042],
              ["backward", 0, 0.043, 0.063], ["p2p", 1, 0.020, 0.024],  # overlaps a forward and a backward
              ["grad_sync", -1, 0.063, 0.065], ["optimizer", -1, 0.070, 0.075]]
    t = span_totals(events)
    assert t["forward"] == pytest.approx(0.020) and t["backward"] == pytest.approx(0.040)
    assert t["p2p"] == pytest.approx(0.004) and t["optimizer"] == pytest.approx(0.005)
    assert t["micro_batches"] == 2 and t["step_s"] == pytest.approx(0.075)
    # gaps 0.010-0.012, 0.042-0.043 and 0.065-0.070: 8 ms no span covers (the p2p overlap counted once)
    assert t["uncovered_s"] == pytest.approx(0.008)
    assert span_totals([]) == {"micro_batches": 0.0, "step_s": 0.0, "uncovered_s": 0.0}


def test_a_row_traces_its_bottleneck_rank_not_the_last_to_finish() -> None:
    """Every rank of a step ends at its last collective together, so the largest ``step_s`` picked any
    rank: on 4x H200 (2026-11-27) the packed DP 4 row showed GPU 3, whose 49.8 ms of gradient sync was
    its wait for GPU 0, as if the sync were exposed; GPU 0 did 282.7 ms of forward and backward and
    synced in 5.6 ms."""
    from benchmarks.planner.fidelity_repredict import repredict

    run = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "fidelity_h200x4_20261127T124458Z.json"
    [row] = [r for r in repredict(run) if r["plan"] == "packed-1.3b-dp4"]
    t = row["traced_s"]
    assert t["forward"] + t["backward"] == pytest.approx(0.2827, abs=5e-4)
    assert t["grad_sync"] == pytest.approx(0.0056, abs=5e-4)

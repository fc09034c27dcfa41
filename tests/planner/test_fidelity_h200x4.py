"""The cost model held to what the fidelity program measured on a fresh 4x H200 host on 2026-11-27
(``benchmarks/results/fidelity_h200x4_20261127T124458Z.json``, its first half, ``--part 1/2``: 8
plans, calibrated in the same run, the MPS share included), priced again from that run's own host
calibrations (:mod:`benchmarks.planner.fidelity_repredict`, helpers in ``_fidelity_recorded``).

``RECORDED`` is each plan's predicted/measured - 1 with the model of this test's commit; a change
that moves a plan more than ``MARGIN`` further from its measurement fails here. Known misses (issue
32): the packed row under-predicted by 19 % (its bottleneck GPU's forward and backward: 282.7 ms traced
for 215 predicted; GPU 3, with the same documents, 243.7; its gradient sync 5.6 ms), TP 2 x DP 2
under MPS by 15.1 % (its forward, ~500 ms on both TP pairs in the MPS step, where the 50 % share's
live TP 2 layer was timed alone at 1.57 ms at micro-batch 2 and the whole GPU's at 1.96: the whole
GPU is now bounded by its share, :mod:`planner.cost.measured` rule 7, where the rule's first form
floored the share by the whole GPU and had it at -7.9 %), the 13B TP 2 -> TP 2 full-recompute plan by
6.9 % (its phases priced within 5 % of the trace since the 7B and 13B layers are priced from this host's
own timings of them, rule 8, where the fitted roofline had them 9-11 % over; the step holds ~100 ms of
gradient sync on the share's ranks and ~230 ms beyond its trace that the model does not price)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _fidelity_recorded import RESULTS, meets_issue_32_bar, recorded_tests

RUN = "fidelity_h200x4_20261127T124458Z.json"
RECORDED = {"planner-1.3b-gb32": 0.033, "1.3b-tp4-m4": -0.015, "packed-1.3b-dp4": -0.189, "7b-pp4-m8": 0.023,
            "7b-tp2xpp2-m8": -0.038, "mps-1.3b-dp4-even": 0.017, "mps-1.3b-tp2xdp2": -0.151,
            "mps-13b-tp2-tp2-full": -0.069}
MARGIN = 0.03


rows, test_every_recorded_plan_is_priced, test_plan_error_within_recorded, \
    test_memory_is_never_under_predicted_by_more_than_5_percent = recorded_tests(RUN, RECORDED, MARGIN, 32)


@pytest.mark.xfail(strict=True, reason="issue 32: mean |error| 6.7 %, worst 18.9 % (packed) on this run")
def test_issue_32_bar(rows: dict[str, dict[str, Any]]) -> None:
    assert meets_issue_32_bar(rows)


def test_a_run_without_its_home_is_refused_in_one_line(tmp_path: Path) -> None:
    from benchmarks.planner.fidelity_repredict import main

    with pytest.raises(SystemExit, match="no file"):
        main([str(tmp_path / "missing.json")])
    lone = tmp_path / "run.json"
    lone.write_text((RESULTS / RUN).read_text())
    with pytest.raises(SystemExit, match="no host home"):
        main([str(lone)])

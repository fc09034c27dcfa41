"""The cost model held to a held-out run: the whole fidelity program on a fresh 4x H100 host on
2026-11-27 17:33-17:40 UTC (``benchmarks/results/fidelity_h100x4_20261127T173836Z.json``, 18 plans,
calibrated in the same run with ``--sm-percent 100,50``; the model of this test's commit was made
before the run and not fitted to it), priced again from that run's own host calibrations
(:mod:`benchmarks.planner.fidelity_repredict`, helpers in ``_fidelity_recorded``).

``RECORDED`` is each plan's predicted/measured - 1 as the run printed it; a change that moves a plan
more than ``MARGIN`` further from its measurement fails here. The run misses issue 32's bar: mean
5.4 % (bar 5 %), worst 14.1 % (bar 10 %). Where it misses, by the traced phases (ms, traced against
priced): the whole GPU's TP 2 x DP 2 forward 288 against 200 (its backward 254 against 254), TP 4's
forward 281 against 231; the packed DP 4 forward 140 against 65; the MPS TP 2 x DP 2 over-predicted
(+14.1 %; on 4x H200 at 12:44 the same plan was -15.1 %). Memory: every figure within +8.9 %, none
under by more than 0.1 %."""

from __future__ import annotations

from typing import Any

import pytest
from _fidelity_recorded import meets_issue_32_bar, recorded_tests

RUN = "fidelity_h100x4_20261127T173836Z.json"
RECORDED = {"planner-1.3b-gb32": 0.027, "1.3b-dp4": -0.038, "1.3b-pp4-m16": -0.100, "1.3b-tp4-m4": -0.069,
            "1.3b-tp2xdp2": -0.123, "1.3b-dp4-compiled": 0.036, "packed-1.3b-dp4": -0.099,
            "packed-1.3b-pp2xdp2": 0.012, "planner-7b-gb16": -0.028, "7b-pp4-m8": -0.004, "7b-tp2xpp2-m8": -0.078,
            "mps-planner-1.3b-gb32": -0.057, "mps-1.3b-dp4-even": -0.012, "mps-1.3b-pp2xdp2-even": -0.020,
            "mps-1.3b-tp2xdp2": 0.141, "mps-packed-1.3b-dp4": -0.071, "mps-planner-13b-gb16": 0.006,
            "mps-13b-tp2-tp2-full": -0.048}
MARGIN = 0.03


rows, test_every_recorded_plan_is_priced, test_plan_error_within_recorded, \
    test_memory_is_never_under_predicted_by_more_than_5_percent = recorded_tests(RUN, RECORDED, MARGIN, 72)


@pytest.mark.xfail(strict=True, reason="issue 32: mean 5.4 %, worst 14.1 % on this held-out run")
def test_issue_32_bar(rows: dict[str, dict[str, Any]]) -> None:
    assert meets_issue_32_bar(rows)

"""The cost model held to what the fidelity program measured on a fresh 4x H100 host on 2026-11-27
15:02-15:06 UTC (``benchmarks/results/fidelity_h100x4_20261127T150612Z.json``, its second half,
``--part 2/2``: 10 plans, calibrated in the same run with ``--sm-percent 100,50``), priced again from
that run's own host calibrations (:mod:`benchmarks.planner.fidelity_repredict`, helpers in
``_fidelity_recorded``). (``test_fidelity_h100x4.py`` holds an earlier run of that day, 01:15 UTC.)

``RECORDED`` is each plan's predicted/measured - 1 with the model of this test's commit; a change
that moves a plan more than ``MARGIN`` further from its measurement fails here. As recorded the
whole-GPU plans were over-predicted by 9-24 % (the calibration's first layer rows timed with added
host time in their forward; :mod:`planner.cost.measured` rule 7 and the ``retimed`` rows now bound
them). Known misses (issue 32): the 7B plan +14 % (its gradient sync priced at 108 ms where the step
traced 13 ms, and its layer priced by the fitted roofline +12 % in forward), the 13B MPS plan +12 %,
the compiled DP 4 +10 % (its layer priced from the eager table by the compiled/eager ratio)."""

from __future__ import annotations

from typing import Any

import pytest
from _fidelity_recorded import meets_issue_32_bar, recorded_tests

RUN = "fidelity_h100x4_20261127T150612Z.json"
RECORDED = {"1.3b-dp4": 0.000, "1.3b-pp4-m16": -0.030, "1.3b-tp2xdp2": -0.008, "1.3b-dp4-compiled": 0.098,
            "packed-1.3b-pp2xdp2": 0.084, "planner-7b-gb16": 0.143, "mps-planner-1.3b-gb32": 0.026,
            "mps-1.3b-pp2xdp2-even": 0.015, "mps-packed-1.3b-dp4": 0.022, "mps-planner-13b-gb16": 0.123}
MARGIN = 0.03


rows, test_every_recorded_plan_is_priced, test_plan_error_within_recorded, \
    test_memory_is_never_under_predicted_by_more_than_5_percent = recorded_tests(RUN, RECORDED, MARGIN, 40)


def test_whole_gpu_plans_are_no_longer_over_predicted(rows: dict[str, dict[str, Any]]) -> None:
    """The case: every whole-GPU 1.3B eager plan was +13-17 % with the calibration's rows as timed."""
    for name in ("1.3b-dp4", "1.3b-pp4-m16", "1.3b-tp2xdp2"):
        assert abs(rows[name]["time_err"]) <= 0.05, (name, rows[name]["time_err"])


@pytest.mark.xfail(strict=True, reason="issue 32: mean |error| 5.5 %, worst 14.3 % (planner-7b-gb16) on this run")
def test_issue_32_bar(rows: dict[str, dict[str, Any]]) -> None:
    assert meets_issue_32_bar(rows)

"""Measured rows now carry the host's issue time of each pass (``forward_host_s``, ``backward_host_s``:
executor/profiler/timing.py); the packaged profiles predate them. The planner reads both alike: the
host times are evidence for the reader of a row, not yet a term of the cost model."""

from __future__ import annotations

import copy
from dataclasses import replace

from planner.calibration.fit import compute_observations
from planner.catalog import default_catalog
from planner.cost.measured import MeasuredProfile
from planner.model import PRESETS


def test_rows_with_and_without_host_times_price_and_fit_the_same() -> None:
    old = default_catalog().get("h100-sxm-measured")
    measured = copy.deepcopy(dict(old.measured or {}))
    for table in ("layer", "embedding", "head"):
        for row in measured[table]:
            row["forward_host_s"], row["backward_host_s"] = row["forward_s"] / 2, row["backward_s"] / 2
    new = replace(old, measured=measured)
    model = PRESETS["llama-1.3b"]
    a, b = MeasuredProfile(old), MeasuredProfile(new)
    for mb in (1, 2, 3, 4):
        assert a.layer_time(model, mb) == b.layer_time(model, mb)
        assert a.head_time(model, mb) == b.head_time(model, mb)
        assert a.embedding_time(model, mb) == b.embedding_time(model, mb)
    assert [o[3:] for o in compute_observations(old)] == [o[3:] for o in compute_observations(new)]

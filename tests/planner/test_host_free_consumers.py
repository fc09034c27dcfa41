"""Every reader of measured pass times takes ``max(device, host)`` from host-free rows
(:func:`planner.cost.pass_times.pass_seconds`): the packed (varlen) fit here; the compiled/eager ratio
(executor/profiler/compiled.py: tests/profiler/test_compiled_pass_time.py) and the live rows' collective fit
(planner/calibration/collective.py) the same way. A host-free table fits
as the same table would with each pass's larger time in ``forward_s``/``backward_s``."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

from planner.calibration.packed import packed_fit
from planner.calibration.store import load_params
from planner.catalog import parse_device_entry
from planner.cost.profile import SpecProfile
from planner.model import model_from_dict

HERE = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "calibrations"
NAME = "h100-sxm-measured_20261127T0629Z"


def test_the_packed_fit_of_host_free_rows_is_that_of_their_pass_times() -> None:
    dev = parse_device_entry(json.loads((HERE / f"{NAME}.device.json").read_text()), NAME)
    params, model = load_params(HERE / f"{NAME}.json"), model_from_dict(dev.measured["model"])
    split = copy.deepcopy(dict(dev.measured))
    split["meta"] = {**split["meta"], "device_times": "full-queue"}
    for i, row in enumerate(split["packed"]["rows"]):  # half launch-bound, half device-bound
        for ph in ("forward", "backward"):
            t = row[f"{ph}_s"]
            row[f"{ph}_s"], row[f"{ph}_host_s"] = (0.5 * t, t) if i % 2 else (t, 0.5 * t)
    want = packed_fit(SpecProfile(dev, params), model, "bf16")
    got = packed_fit(SpecProfile(replace(dev, measured=split), params), model, "bf16")
    assert want is not None and got == want


"""The layer of another model width the calibration timed prices that model (:mod:`planner.cost.measured`
rule 8), not the roofline fitted to every width at once. On 4x H100 (2026-11-27,
``benchmarks/results/fidelity_h100x4_20261127T150612Z.home.json``) the 7B layer was timed at 3.72 ms
forward at micro-batch 2 and the 7B step traced 3.66; the fitted roofline priced ~4.2 ms (+12 %)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from benchmarks.fidelity.host_home import installed
from planner.calibration.local import calibrations
from planner.calibration.store import load_params
from planner.catalog import default_catalog
from planner.cost import ProfileSet
from planner.errors import SpecError
from planner.model import PRESETS

HOME = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "fidelity_h100x4_20261127T150612Z.home.json"
FULL = "h100-sxm-measured"


@pytest.fixture()
def files() -> dict[str, Any]:
    return json.loads(HOME.read_text())


def _width(files: dict[str, Any], name: str) -> dict[str, Any]:
    return next(w for w in files[f"devices/{FULL}.json"]["measured"]["widths"] if w["model"]["name"] == name)


@pytest.mark.parametrize("name", ["llama2-7b", "llama2-13b"])
def test_a_timed_width_prices_its_own_layer(files: dict[str, Any], name: str) -> None:
    width = _width(files, name)
    model = replace(PRESETS[name], seq_len=width["model"]["seq_len"])
    with installed(files):
        params = load_params(next(c for c in calibrations() if FULL in c.applies_to).path)
        prof = ProfileSet(default_catalog(), params).get(FULL)
        for row in width["layer"]:
            got = prof.layer_time(model, row["micro_batch"], 1, "bf16", "none")
            assert (got.forward_s, got.backward_s) == pytest.approx((row["forward_s"], row["backward_s"]))
        # carried beyond its rows by the roofline's shape, from its own level: above micro-batch 2's row
        assert prof.layer_time(model, 4, 1, "bf16", "none").forward_s > width["layer"][1]["forward_s"]
        # it times the layer, it does not size it: memory stays the formula's
        assert prof.activation_bytes("layer", model, 2, 1, "bf16") is None


def test_a_width_that_is_no_mapping_is_one_error_naming_it(files: dict[str, Any]) -> None:
    files[f"devices/{FULL}.json"]["measured"]["widths"][1] = 7
    with installed(files), pytest.raises(SpecError, match=r"measured\.widths\[1\]"):
        ProfileSet(default_catalog()).get(FULL)

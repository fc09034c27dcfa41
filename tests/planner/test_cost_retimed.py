"""A table point the calibration timed twice is priced from the lower timing (``measured.retimed``,
:func:`planner.catalog._retimed`, :func:`planner.cost.measured_tables.bounded`). On 4x H100
(2026-11-27, ``benchmarks/results/fidelity_h100x4_20261127T150612Z.home.json``) the layer row at
micro-batch 2, among the first the calibration timed, took 1.76 ms forward; its compile check timed
the same point at the end of the run at 1.34 ms; the DP 4 step traced 1.26 ms per layer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.fidelity.host_home import installed
from planner.catalog import default_catalog
from planner.cost import ProfileSet
from planner.errors import SpecError
from planner.model import model_from_dict

HOME = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "fidelity_h100x4_20261127T150612Z.home.json"
FULL = "h100-sxm-measured"


@pytest.fixture()
def files() -> dict[str, Any]:
    return json.loads(HOME.read_text())


def _mb2(files: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    row = next(r for r in files[f"devices/{FULL}.json"]["measured"]["layer"]
               if (r["micro_batch"], r["tp"], r["recompute"], bool(r.get("collectives"))) == (2, 1, "none", False))
    return row, files[f"calibration/{FULL}.json"]["fits"]["compile"]


def test_the_point_timed_again_is_priced_from_the_lower_timing(files: dict[str, Any]) -> None:
    row, comp = _mb2(files)
    assert (comp["micro_batch"], comp["tp"]) == (2, 1) and comp["eager"]["forward_s"] < 0.8 * row["forward_s"]
    with installed(files):
        entry = default_catalog().get(FULL)
        assert entry.measured is not None and len(entry.measured["retimed"]) == 1
        model = model_from_dict(entry.measured["model"])
        got = ProfileSet(default_catalog()).get(FULL).layer_time(model, 2, 1, "bf16", "none")
    assert got.forward_s == pytest.approx(comp["eager"]["forward_s"])
    assert got.backward_s == pytest.approx(min(row["backward_s"], comp["eager"]["backward_s"]))


def test_without_a_compile_check_the_table_stands(files: dict[str, Any]) -> None:
    del files[f"calibration/{FULL}.json"]["fits"]["compile"]
    with installed(files):
        assert "retimed" not in (default_catalog().get(FULL).measured or {})


def test_a_bad_second_timing_is_one_error_naming_it(files: dict[str, Any]) -> None:
    files[f"calibration/{FULL}.json"]["fits"]["compile"]["eager"]["forward_s"] = -1.0
    with installed(files), pytest.raises(SpecError, match=r"measured\.retimed\[0\]"):
        ProfileSet(default_catalog()).get(FULL)

"""The calibrated-parameters file: ``planner/profiles/calibration/<name>.json``.

    {"format": "hexiscale.calibration/1", "applies_to": [catalog keys], "params": {every CostParams field},
     "fitted": {term: value}, "fits": {what each group of terms was fitted to, errors before/after},
     "provenance": {"devices": [...], "date": ..., "gpu": ...}}

``load_params`` returns a ``CostParams`` (unknown fields are an error with a hint);
``calibrated_profile_set`` a :class:`planner.cost.ProfileSet` (measured tables where the catalog has
them) with them.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

from planner.catalog import Catalog, profiles_dir
from planner.cost.params import DEFAULT_PARAMS, CostParams
from planner.cost.profile_set import ProfileSet
from planner.documents import load_json_file
from planner.errors import SpecError

CALIBRATION_FORMAT = "hexiscale.calibration/1"


def default_calibration_path(name: str = "h100") -> Path:
    return profiles_dir() / "calibration" / f"{name}.json"


def save_calibration(path: Path, params: CostParams, *, fitted: dict[str, float], fits: dict[str, Any],
                     provenance: dict[str, Any], applies_to: list[str] | None = None) -> None:
    """``applies_to``: the catalog keys the terms were measured for (planner.calibration.local)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {"format": CALIBRATION_FORMAT}
    if applies_to is not None:
        data["applies_to"] = applies_to
    data.update({"params": params.to_dict(), "fitted": fitted, "fits": fits, "provenance": provenance})
    path.write_text(json.dumps(data, indent=1) + "\n")


def load_params(path: Path) -> CostParams:
    data = load_json_file(path, "calibration")
    if not isinstance(data, dict) or data.get("format") != CALIBRATION_FORMAT:
        raise SpecError("format", f"expected {CALIBRATION_FORMAT!r}", "re-run the calibration", str(path))
    raw = data.get("params")
    if not isinstance(raw, dict):
        raise SpecError("params", "missing", "re-run the calibration", str(path))
    known = {f.name for f in fields(CostParams)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise SpecError(f"params.{unknown[0]}", "is not a CostParams term", f"known terms: {', '.join(sorted(known))}",
                        str(path))
    try:
        return CostParams(**{**DEFAULT_PARAMS.to_dict(), **raw})
    except SpecError as exc:
        raise exc.with_file(str(path)) from None


def calibrated_profile_set(catalog: Catalog | None = None, path: Path | None = None) -> ProfileSet:
    """Measured profiles with the calibrated terms (defaults when no calibration file exists)."""
    path = path or default_calibration_path()
    params = load_params(path) if path.exists() else DEFAULT_PARAMS
    return ProfileSet(catalog, params)

"""A host's measured MPS share, as ``hexiscale calibrate --sm-percent 50`` writes it into
``$HEXISCALE_HOME``: the shipped 50 % share's tables under the host key ``h100-sxm-mps50-measured``
(layer times scaled, so a test can tell which tables priced a node) and its calibration."""

from __future__ import annotations

import json
from pathlib import Path

from planner.calibration.store import save_calibration
from planner.catalog import profiles_dir
from planner.cost.params import DEFAULT_PARAMS


def host_share(home: Path, slower: float) -> Path:
    """A host's measured 50 % share (the shipped share's tables, ``slower`` x its layer times) and its
    calibration, as ``calibrate --sm-percent 50`` writes them."""
    entry = json.loads((profiles_dir() / "devices" / "h100-sxm-mps50.json").read_text())
    entry["key"] = "h100-sxm-mps50-measured"
    for row in entry["measured"]["layer"]:
        row["forward_s"] *= slower
        row["backward_s"] *= slower
    (home / "devices").mkdir(parents=True)
    (home / "devices" / "h100-sxm-mps50-measured.json").write_text(json.dumps(entry))
    cal = home / "calibration" / "h100-sxm-mps50-measured.json"
    save_calibration(cal, DEFAULT_PARAMS, fitted={}, applies_to=["h100-sxm-mps50-measured", "h100-sxm-mps50"],
                     fits={"compute": {"held_out": {"mean_abs_rel": 0.03, "max_abs_rel": 0.06, "folds": 5}}},
                     provenance={"date": "2026-11-27", "host_fingerprint": "this-host:abc"})
    return cal

"""An MPS share is never faster than its whole GPU (:mod:`planner.cost.measured` rule 7). On 4x H200
(2026-11-27, ``benchmarks/results/fidelity_h200x4_20261127T124458Z.home.json``) ``calibrate
--sm-percent 100,50`` timed the 50 % share's live TP 2 layer under the full GPU's (forward 1.57 vs
1.96 ms at micro-batch 2: launch-bound rows, timing noise), so TP 2 x DP 2 priced the share's pair
faster in forward than the full pair; both ran ~500 ms."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.catalog import Catalog, default_catalog, load_catalog_dir
from planner.cost import ProfileSet
from planner.model import model_from_dict

HOME = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "fidelity_h200x4_20261127T124458Z.home.json"
FULL, SHARE = "h200-measured", "h200-mps50-measured"


@pytest.fixture(scope="module")
def files() -> dict:  # type: ignore[type-arg]
    return json.loads(HOME.read_text())


def _profiles(files: dict, keys: tuple[str, ...], tmp: Path) -> ProfileSet:  # type: ignore[type-arg]
    folder = tmp / "devices"
    folder.mkdir()
    for key in keys:
        (folder / f"{key}.json").write_text(json.dumps(files[f"devices/{key}.json"]))
    mine = load_catalog_dir(folder).entries
    return ProfileSet(Catalog([e for e in default_catalog().entries if e.key not in keys] + mine))


def test_a_share_layer_is_not_priced_under_its_full_gpu(files: dict, tmp_path: Path) -> None:  # type: ignore[type-arg]
    profiles = _profiles(files, (FULL, SHARE), tmp_path)
    model = model_from_dict(files[f"devices/{FULL}.json"]["measured"]["model"])
    for tp in (1, 2, 4):
        for mb in (1, 2, 4):
            full = profiles.get(FULL).layer_time(model, mb, tp, "bf16", "none")
            share = profiles.get(SHARE).layer_time(model, mb, tp, "bf16", "none")
            assert share.forward_s >= full.forward_s and share.backward_s >= full.backward_s, (tp, mb)
    # where the share's own rows are slower they stand (its tables are not replaced)
    own = files[f"devices/{SHARE}.json"]["measured"]["layer"][1]  # micro-batch 2, TP 1: 2.17 / 3.80 ms
    assert (own["micro_batch"], own["tp"], own["recompute"]) == (2, 1, "none")
    got = profiles.get(SHARE).layer_time(model, 2, 1, "bf16", "none")
    assert got.forward_s == pytest.approx(own["forward_s"]) and got.backward_s == pytest.approx(own["backward_s"])


@pytest.mark.parametrize("field,value", [("gpu_name", "NVIDIA H100 80GB HBM3"), ("torch", "2.9.0+cu128")])
def test_a_share_timed_apart_from_the_full_gpu_keeps_its_own_rows(files: dict, tmp_path: Path,  # type: ignore[type-arg]
                                                                   field: str, value: str) -> None:
    """The twin is the same GPU model timed by the same software beside it: a full H200 says nothing
    of another GPU's share, nor of a share timed by another torch."""
    files = json.loads(json.dumps(files))
    files[f"devices/{SHARE}.json"]["measured"]["meta"][field] = value
    profiles = _profiles(files, (FULL, SHARE), tmp_path)
    assert profiles.full_sm_twin(profiles.catalog.get(SHARE)) is None
    model = model_from_dict(files[f"devices/{FULL}.json"]["measured"]["model"])
    live = next(r for r in files[f"devices/{SHARE}.json"]["measured"]["layer"]
                if r.get("collectives") and (r["micro_batch"], r["tp"]) == (2, 2))
    got = profiles.get(SHARE).layer_time(model, 2, 2, "bf16", "none")
    assert got.forward_s == pytest.approx(live["forward_s"])  # 1.57 ms: its own row, under the full GPU's

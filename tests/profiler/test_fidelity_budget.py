"""The fidelity program in one device call of 10 minutes (issue 32 item 4): its expected time per
phase, printed when it starts, fits; it calibrates the MPS share its plans run under, carries that
share with ``--calibration``, and the share's nodes are then priced by this host's calibration."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.fidelity.host4 import cluster_for
from benchmarks.planner.fidelity_budget import CALIBRATE_S, CALIBRATE_SHARE_S, budget, plan_s
from benchmarks.planner.fidelity_calibrate import (
    calibrate_command,
    install_calibration,
    read_calibration,
    unpriced_here,
)
from benchmarks.planner.fidelity_plans import MPS, launches
from planner.calibration.local import resolve_profiles
from planner.calibration.store import save_calibration
from planner.cost.params import DEFAULT_PARAMS
from tests.support.host_share import host_share


def test_the_whole_program_is_expected_within_10_minutes_on_4_gpus() -> None:
    full = launches(quick=False)
    names = [c.name for launch in full for c in launch.cases]
    b = budget(full, names, shares=[50], calibrating=True)
    assert [n for n, _ in b.phases] == ["calibrate", "planner searches", "sm100x4 (11 plans)",
                                        "sm100-100-50-50 (7 plans)"]
    assert dict(b.phases)["calibrate"] == CALIBRATE_S + CALIBRATE_SHARE_S  # the whole GPU and its 50 % share
    assert b.total_s <= 600 and "expected wall time on 4x H100" in b.line() and "calibrate ~135 s" in b.line()
    reused = budget(full, names[:2], shares=[50], calibrating=False)  # --calibration, two plans of one launch
    assert [n for n, _ in reused.phases] == ["planner searches", "sm100x4 (2 plans)"]
    compiled = next(c for launch in full for c in launch.cases if c.name == "1.3b-dp4-compiled")
    plain = next(c for launch in full for c in launch.cases if c.name == "1.3b-dp4")
    assert plan_s(compiled) > plan_s(plain) > 0


def test_calibrate_measures_the_share_the_plans_run_under(tmp_path: Path) -> None:
    cmd = calibrate_command(tmp_path, quick=False, force=False, shares=[50])
    assert cmd[cmd.index("--sm-percent") + 1] == "100,50" and "--force" not in cmd
    assert "--sm-percent" not in calibrate_command(tmp_path, quick=False, force=True, shares=[])
    assert "--cpu" in calibrate_command(tmp_path, quick=True, force=False, shares=[50])
    assert sorted({s for launch in launches(quick=False) for s in launch.sm if s < 100}) == [50]


def test_a_given_calibration_brings_its_share_and_prices_the_share_nodes(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "src"
    host_share(src, slower=1.1)
    full = src / "calibration" / "h100-sxm-measured.json"
    save_calibration(full, DEFAULT_PARAMS, fitted={}, fits={}, provenance={"date": "2026-11-27"},
                     applies_to=["h100-sxm-measured", "h100-sxm"])
    alone, home = tmp_path / "alone", tmp_path / "home"
    (alone / "calibration").mkdir(parents=True)
    (alone / "calibration" / full.name).write_text(full.read_text())
    install_calibration(full, home)
    install_calibration(alone / "calibration" / full.name, tmp_path / "home-without")
    cal = read_calibration(home)
    assert Path(cal["file"]).name == full.name and [Path(f).name for f in cal["shares"]] == [
        "h100-sxm-mps50-measured.json"]
    assert (home / "devices" / "h100-sxm-mps50-measured.json").is_file()
    monkeypatch.setenv("HEXISCALE_HOME", str(home))
    resolved = resolve_profiles(cluster_for(MPS, "h100-sxm-measured", cpu=False))
    assert resolved.priced_by["g2"]["profile"] == "h100-sxm-mps50-measured" and unpriced_here(resolved.priced_by) == []
    monkeypatch.setenv("HEXISCALE_HOME", str(tmp_path / "home-without"))
    missing = unpriced_here(resolve_profiles(cluster_for(MPS, "h100-sxm-measured", cpu=False)).priced_by)
    assert [m.split()[0] for m in missing] == ["g2", "g3"]  # priced from what was shipped, not measured here

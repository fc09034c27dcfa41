"""The fidelity program in parts (issue 32: >= 16 plans inside 10-minute device calls): the parts
cover every plan once and balance the expected time, a plan's timing stops early only when its
steps agree, and ``--merge`` makes one table of parts measured with one calibration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.fidelity.steady import enough, steady
from benchmarks.planner.fidelity import main, phase_totals
from benchmarks.planner.fidelity_plans import launches
from benchmarks.planner.fidelity_split import CALIBRATE_S, expected_s, merge_results, parse_part, part_names


def test_parts_cover_every_plan_once_and_balance_the_time() -> None:
    full = launches(quick=False)
    cases = {c.name: c for launch in full for c in launch.cases}
    parts = [part_names(full, k, 2) for k in (1, 2)]
    assert sorted(parts[0] + parts[1]) == sorted(cases) and not set(parts[0]) & set(parts[1])
    loads = [CALIBRATE_S + sum(expected_s(cases[n]) for n in parts[0]), sum(expected_s(cases[n]) for n in parts[1])]
    assert max(loads) - min(loads) <= max(expected_s(c) for c in cases.values())  # part 1 also calibrates
    assert max(loads) < 0.6 * sum(loads)
    assert part_names(full, 1, 1) == list(cases)  # one part: every plan, in program order


def test_part_argument_is_checked() -> None:
    assert parse_part("2/3") == (2, 3)
    for bad in ("3/2", "0/2", "a/b", "1"):
        with pytest.raises(ValueError, match="--part"):
            parse_part(bad)


def test_timing_stops_only_once_the_steps_agree() -> None:
    assert steady([0.50, 0.501, 0.499]) and not steady([0.50, 0.52, 0.49]) and not steady([0.5, 0.5])
    assert not enough([0.40, 0.50, 0.45], min_steps=3, max_steps=6)  # still moving: more steps
    assert enough([0.40, 0.50, 0.45, 0.451, 0.452], min_steps=3, max_steps=6)  # the last 3 agree
    assert enough([0.1, 0.3, 0.2, 0.4, 0.1, 0.3], min_steps=3, max_steps=6)  # never steady: all 6
    assert not enough([0.5, 0.5, 0.5], min_steps=6, max_steps=6)  # min = max: always every step


def _part(path: Path, rows: list[dict[str, object]], cal: str = "/h/calibration/h100-sxm-measured.json",
          date: str = "2026-11-27T01:16:17+00:00") -> Path:
    meta = {"calibration_file": cal, "calibration_provenance": {"date": date}, "wall_s": 300.0, "quick": False,
            "gpu": "NVIDIA H100 80GB HBM3", "gpus": 4, "started": "20261127T020000Z"}
    path.write_text(json.dumps({"benchmark": "planner.fidelity", "partial": False, "meta": meta, "rows": rows,
                                "runs": [{"name": path.stem}]}))
    return path


def _row(name: str, err: float) -> dict[str, object]:
    return {"plan": name, "sm": [100] * 4, "predicted_s": 1.0 + err, "measured_s": 1.0, "time_err": err,
            "memory": [], "term": "compute", "phases_s": {"steps": 4.0}}


def test_merge_makes_one_table_of_parts_with_one_calibration(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    traced = {**_row("1.3b-tp4-m4", -0.06), "traced_s": {"forward": 0.2, "backward": 0.28, "uncovered_s": 0.004},
              "model_spans_s": {"forward": 0.19, "backward": 0.23}}
    a = _part(tmp_path / "a.json", [_row("1.3b-dp4", 0.02), traced])
    b = _part(tmp_path / "b.json", [_row("7b-pp4-m8", 0.04)])
    assert main(["--merge", str(a), str(b), "--out", str(tmp_path / "out")]) == 0
    (path,) = (tmp_path / "out").glob("fidelity_h100x4_*_merged.json")
    data = json.loads(path.read_text())
    assert [r["plan"] for r in data["rows"]] == ["1.3b-dp4", "1.3b-tp4-m4", "7b-pp4-m8"] and len(data["runs"]) == 2
    assert data["summary"]["plans"] == 3 and data["summary"]["time_max_abs"] == pytest.approx(0.06)
    assert data["summary"]["time_mean_abs"] == pytest.approx(0.04) and data["meta"]["wall_s"] == 600.0
    out = capsys.readouterr().out
    assert "mean |error|" in out and "steps 12 s" in out
    assert "| 1.3b-tp4-m4 | 200.0 (190.0) | 280.0 (230.0) | 0.0 (0.0) |" in out  # the traced step's spans
    assert phase_totals(data["rows"]) == {"steps": 12.0}


def test_merge_refuses_other_calibrations_and_repeated_plans(tmp_path: Path) -> None:
    a = _part(tmp_path / "a.json", [_row("1.3b-dp4", 0.02)])
    other = _part(tmp_path / "b.json", [_row("7b-pp4-m8", 0.04)], date="2026-11-28T00:00:00+00:00")
    with pytest.raises(ValueError, match=r"b\.json: measured with calibration .* --calibration"):
        merge_results([a, other])
    again = _part(tmp_path / "c.json", [_row("1.3b-dp4", 0.03)])
    with pytest.raises(ValueError, match=r"plan 1\.3b-dp4 is also in"):
        merge_results([a, again])
    with pytest.raises(SystemExit, match="two or more"):
        main(["--merge", str(a)])


def test_a_later_part_reuses_the_first_parts_calibration_in_the_same_folder(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """``--part 2/2 --calibration OUT/hexiscale-home/calibration/KEY.json --out OUT``: the run makes its
    home afresh, and the calibration it was given from there survives that."""
    import argparse

    from benchmarks.planner import fidelity
    from planner.calibration.store import save_calibration
    from planner.cost.params import DEFAULT_PARAMS

    cal = tmp_path / "hexiscale-home" / "calibration" / "h100-sxm-measured.json"
    save_calibration(cal, DEFAULT_PARAMS, fitted={}, fits={}, provenance={"date": "2026-11-27"},
                     applies_to=["h100-sxm-measured"])
    seen: list[str] = []

    def stop(home: Path) -> dict[str, object]:
        seen.append((home / "calibration" / cal.name).read_text())
        raise SystemExit(0)

    monkeypatch.setattr(fidelity, "read_calibration", stop)
    monkeypatch.setenv("HEXISCALE_HOME", str(tmp_path / "elsewhere"))
    with pytest.raises(SystemExit):
        fidelity.run(argparse.Namespace(out=str(tmp_path), calibration=str(cal), quick=True, force_calibration=False,
                                           plans=[]))
    assert seen and "h100-sxm-measured" in seen[0]

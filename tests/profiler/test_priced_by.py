"""``plan`` and ``estimate`` say which calibration priced each node (``priced_by`` in the estimate JSON, a
``priced by:`` line), and a cluster node's ``calibration:`` field points it at a host calibration: a
file or the id of one under ``$HEXISCALE_HOME/calibration``, strictly checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hexiscale.cli.main import main
from planner.calibration.local import resolve_profiles
from planner.calibration.store import save_calibration
from planner.cluster import load_cluster
from planner.cost.params import DEFAULT_PARAMS
from planner.errors import SpecError

LINK = "intra_link: {kind: nvlink, bandwidth_GBps: 450, latency_us: 10}"


def host_calibration(home: Path, name: str, applies_to: list[str], date: str, held: float = 0.04) -> Path:
    path = home / "calibration" / f"{name}.json"
    save_calibration(path, DEFAULT_PARAMS, fitted={}, applies_to=applies_to,
                     fits={"compute": {"held_out": {"mean_abs_rel": held, "max_abs_rel": 2 * held, "folds": 5}}},
                     provenance={"date": date, "host_fingerprint": f"{name}-host:abc"})
    return path


def cluster_file(tmp_path: Path, h100_extra: str = "", h200_extra: str = "") -> Path:
    path = tmp_path / "mixed.yaml"
    path.write_text("name: mixed\nnodes:\n"
                    f"  - {{name: a, gpu: h100-sxm, gpus: 1, {LINK}{h100_extra}}}\n"
                    f"  - {{name: b, gpu: h200-measured, gpus: 1, {LINK}{h200_extra}}}\n"
                    f"  - {{name: c, gpu: rtx4090, gpus: 1, {LINK}}}\n"
                    "inter_node: {bandwidth_GBps: 25, latency_us: 5}\n")
    return path


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("HEXISCALE_HOME", str(home))
    return home


def test_each_node_says_which_calibration_priced_it(tmp_path: Path, home: Path) -> None:
    cal = host_calibration(home, "h100-sxm-measured", ["h100-sxm-measured", "h100-sxm"], "2026-11-26")
    table = resolve_profiles(load_cluster(cluster_file(tmp_path))).priced_by
    assert table["a"] == {"profile": "h100-sxm-measured", "calibration": str(cal), "host": "h100-sxm-measured-host:abc",
                          "held_out": {"mean_abs_rel": 0.04, "max_abs_rel": 0.08}, "note": "host calibration"}
    # one set of terms prices an estimate: the H200's shipped measured profile runs on terms not measured for it
    assert table["b"]["profile"] == "h200-measured" and table["b"]["calibration"] is None
    assert table["b"]["note"] == "shipped profile, uncalibrated"
    assert table["c"] == {"profile": "rtx4090", "calibration": None, "host": None, "held_out": None,
                          "note": "datasheet, uncalibrated"}


def test_plan_and_estimate_print_it_and_write_it_in_the_plan_json(tmp_path: Path, home: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    cal = host_calibration(home, "h100-sxm-measured", ["h100-sxm-measured", "h100-sxm"], "2026-11-26")
    cluster, plan = cluster_file(tmp_path), tmp_path / "plan.json"
    assert main(["plan", str(cluster), "--model", "tiny", "--global-batch", "6", "-o", str(plan)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "(held-out error 4.0 % mean, 8.0 % worst)" in lines[0]
    assert lines[1] == (f"priced by: a: host calibration {cal} (host h100-sxm-measured-host:abc); "
                        "b: shipped profile, uncalibrated; c: datasheet, uncalibrated")
    assert json.loads(plan.read_text())["estimate"]["priced_by"]["a"]["calibration"] == str(cal)
    assert main(["estimate", str(plan), "--cluster", str(cluster), "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["priced_by"]["c"]["note"] == "datasheet, uncalibrated"
    assert "priced by: a: host calibration" in out.err


def test_a_node_points_at_a_host_calibration_by_file_or_id(tmp_path: Path, home: Path) -> None:
    host_calibration(home, "newer", ["h100-sxm"], "2026-11-26")
    older = host_calibration(home, "older", ["h100-sxm"], "2026-11-01")
    h200 = host_calibration(tmp_path / "other-host", "h200-measured", ["h200-measured"], "2026-11-20")
    assert resolve_profiles(load_cluster(cluster_file(tmp_path))).calibration.path.name == "newer.json"  # type: ignore[union-attr]
    by_id = resolve_profiles(load_cluster(cluster_file(tmp_path, ", calibration: older")))
    assert by_id.priced_by["a"]["calibration"] == str(older.resolve())
    # a relative file is found from the cluster file's folder, wherever the command runs
    by_file = resolve_profiles(load_cluster(cluster_file(tmp_path, h200_extra=", calibration: "
                                                         "other-host/calibration/h200-measured.json")))
    assert by_file.priced_by["b"]["calibration"] == str(h200.resolve())
    assert by_file.priced_by["a"]["note"] == "shipped profile, uncalibrated"


def test_a_bad_calibration_field_is_one_line_naming_it(tmp_path: Path, home: Path) -> None:
    host_calibration(home, "h100", ["h100-sxm"], "2026-11-26")
    host_calibration(home, "h100-again", ["h100-sxm"], "2026-11-26")
    with pytest.raises(SpecError, match=r"mixed.yaml:3: nodes\[0\].calibration: no host calibration with this "
                       r"id 'nope' .*hint: name a calibration file"):
        load_cluster(cluster_file(tmp_path, ", calibration: nope"))
    for bad in ("x/missing.json", "~nouser/h100.json", "y" * 5000 + ".json", "mixed.yaml/h100.json"):
        with pytest.raises(SpecError, match=rf"nodes\[1\].calibration: no calibration file '{bad[:20]}"):
            load_cluster(cluster_file(tmp_path, h200_extra=f", calibration: {bad}"))
    with pytest.raises(SpecError, match=r"nodes.b.calibration: .*h100.json was measured for h100-sxm, "
                       r"not h200-measured"):
        resolve_profiles(load_cluster(cluster_file(tmp_path, h200_extra=", calibration: h100")))
    with pytest.raises(SpecError, match=r"nodes.b.calibration: names .*h100-again.json while another node names "
                       r".*one set of cost terms prices an estimate"):
        resolve_profiles(load_cluster(cluster_file(tmp_path, ", calibration: h100", ", calibration: h100-again")))
    (home / "calibration" / "junk.json").write_text("[1, 2]")
    with pytest.raises(SpecError, match=r"nodes.a.calibration: .*junk.json is not a calibration"):
        resolve_profiles(load_cluster(cluster_file(tmp_path, ", calibration: junk")))

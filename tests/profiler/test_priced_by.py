"""``plan`` and ``estimate`` say which calibration priced each node (``priced_by`` in the estimate JSON, a
``priced by:`` line): the calibration chosen for the node's GPU type, the same one the estimate's
per-type ``calibration`` names; a cluster node's ``calibration:`` field points its GPU type at a host
calibration: a file or the id of one under ``$HEXISCALE_HOME/calibration``, strictly checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hexiscale.cli.main import main
from planner.calibration.local import resolve_profiles
from planner.calibration.store import save_calibration
from planner.catalog import profiles_dir
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


def cluster_file(tmp_path: Path, h100_extra: str = "", h200_extra: str = "", a2_extra: str | None = None) -> Path:
    """Nodes a (h100-sxm), b (h200-measured), c (rtx4090), with ``a2_extra`` a second h100-sxm node a2."""
    path = tmp_path / "mixed.yaml"
    a2 = "" if a2_extra is None else f"  - {{name: a2, gpu: h100-sxm, gpus: 1, {LINK}{a2_extra}}}\n"
    path.write_text("name: mixed\nnodes:\n"
                    f"  - {{name: a, gpu: h100-sxm, gpus: 1, {LINK}{h100_extra}}}\n"
                    f"  - {{name: b, gpu: h200-measured, gpus: 1, {LINK}{h200_extra}}}\n"
                    f"  - {{name: c, gpu: rtx4090, gpus: 1, {LINK}}}\n" + a2 +
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
    assert table["a"] == {"gpu": "h100-sxm", "profile": "h100-sxm-measured", "calibration": str(cal),
                          "host": "h100-sxm-measured-host:abc", "held_out": {"mean_abs_rel": 0.04, "max_abs_rel": 0.08},
                          "note": "host calibration"}
    # terms are per GPU type: the H200 node is priced by the packaged H200 calibration, not the H100's
    assert table["b"]["profile"] == "h200-measured" and table["b"]["note"] == "packaged calibration"
    assert table["b"]["calibration"] == str(profiles_dir() / "calibration" / "h200.json")
    assert table["c"] == {"gpu": "rtx4090", "profile": "rtx4090", "calibration": None, "host": None,
                          "held_out": None, "note": "datasheet, uncalibrated"}
    # a calibration of the H200 prices the H200 node, and only it
    h200 = host_calibration(home, "h200-measured", ["h200-measured"], "2026-11-20")
    table = resolve_profiles(load_cluster(cluster_file(tmp_path))).priced_by
    assert (table["a"]["calibration"], table["b"]["calibration"], table["c"]["calibration"]) == \
        (str(cal), str(h200), None)


def test_plan_and_estimate_print_it_and_write_it_in_the_plan_json(tmp_path: Path, home: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    cal = host_calibration(home, "h100-sxm-measured", ["h100-sxm-measured", "h100-sxm"], "2026-11-26")
    cluster, plan = cluster_file(tmp_path), tmp_path / "plan.json"
    assert main(["plan", str(cluster), "--model", "tiny", "--global-batch", "6", "-o", str(plan)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "(held-out error 4.0 % mean, 8.0 % worst)" in lines[0]
    assert lines[1] == (f"priced by: a: host calibration {cal} (host h100-sxm-measured-host:abc); "
                        "b: packaged calibration 'h200'; c: datasheet, uncalibrated")
    assert main(["estimate", str(plan), "--cluster", str(cluster), "--json"]) == 0
    out = capsys.readouterr()
    assert "priced by: a: host calibration" in out.err
    for est in (json.loads(plan.read_text())["estimate"], json.loads(out.out)):
        assert set(est["priced_by"]) == {d.split(":")[0] for d in est["memory_gib"]}  # the plan's nodes only
        assert est["priced_by"]["a"]["calibration"] == str(cal)
        for row in est["priced_by"].values():  # per node, the per-type choice that estimate.calibration names
            named = est["calibration"][row["gpu"]]
            if row["calibration"] is None:
                assert named == "default terms"
            else:
                host = row["note"] == "host calibration"
                assert (row["calibration"] if host else f"'{Path(row['calibration']).stem}'") in named


def test_a_node_points_at_a_host_calibration_by_file_or_id(tmp_path: Path, home: Path) -> None:
    host_calibration(home, "newer", ["h100-sxm"], "2026-11-26")
    older = host_calibration(home, "older", ["h100-sxm"], "2026-11-01")
    h200 = host_calibration(tmp_path / "other-host", "h200-measured", ["h200-measured"], "2026-11-20")
    assert resolve_profiles(load_cluster(cluster_file(tmp_path))).priced_by["a"]["calibration"].endswith("newer.json")
    # the field picks the terms of the node's GPU type: every node of that type, and the estimate's label
    by_id = resolve_profiles(load_cluster(cluster_file(tmp_path, ", calibration: older", a2_extra="")))
    assert by_id.priced_by["a"]["calibration"] == by_id.priced_by["a2"]["calibration"] == str(older.resolve())
    assert str(older.resolve()) in by_id.profiles.terms_of("h100-sxm")
    # a relative file is found from the cluster file's folder, wherever the command runs
    by_file = resolve_profiles(load_cluster(cluster_file(tmp_path, h200_extra=", calibration: "
                                                         "other-host/calibration/h200-measured.json")))
    assert by_file.priced_by["b"]["calibration"] == str(h200.resolve())
    assert by_file.priced_by["a"]["calibration"].endswith("newer.json")  # its own type's choice, not the H200's
    # nodes of different types may name different calibrations (terms are per type)
    both = resolve_profiles(load_cluster(cluster_file(tmp_path, ", calibration: older", ", calibration: "
                                                      "other-host/calibration/h200-measured.json")))
    assert (both.priced_by["a"]["calibration"], both.priced_by["b"]["calibration"]) == \
        (str(older.resolve()), str(h200.resolve()))


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
    with pytest.raises(SpecError, match=r"nodes.a2.calibration: names .*h100-again.json while another h100-sxm node "
                       r"names .*h100.json; cost terms are per GPU type"):
        resolve_profiles(load_cluster(cluster_file(tmp_path, ", calibration: h100",
                                                   a2_extra=", calibration: h100-again")))
    (home / "calibration" / "junk.json").write_text("[1, 2]")
    with pytest.raises(SpecError, match=r"nodes.a.calibration: .*junk.json is not a calibration"):
        resolve_profiles(load_cluster(cluster_file(tmp_path, ", calibration: junk")))

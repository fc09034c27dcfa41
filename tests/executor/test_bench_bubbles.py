"""The bubble benchmark's CPU smoke mode (benchmarks/executor/bubbles.py --smoke): 1F1B and ZB-H1
on a 2-stage pipeline of the tiny model, each one launch with --trace; every rank's spans pair with
the registry's op order, and the JSON holds per rank the busy time, the bubble, the peak memory and
the simulator's prediction for the same plan (memory: the model's total and its tensors)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.executor.bubbles import balanced_counts, main, parse_layers, parse_runs, priced_from
from planner.cluster import load_cluster
from planner.errors import SpecError
from planner.hf_config import resolve_model
from tests.support.host_share import host_share

CLUSTER = Path(__file__).resolve().parents[2] / "examples" / "clusters" / "h100x4-mps-100-100-50-50.yaml"


@pytest.mark.slow
@pytest.mark.xdist_group("hexiscale-jobs")
def test_smoke_measures_both_schedules_per_rank(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--smoke", "--out", str(tmp_path)]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "| 1f1b m=4 |" in out and "| zb-h1 m=4 |" in out
    [path] = tmp_path.glob("bubbles_cpu_smoke_*.json")
    res = json.loads(path.read_text())
    assert res["gpu"] is None and res["date"] and res["torch"] and res["exits"] == [0, 0]
    base, zb = res["rows"]
    assert (base["schedule"], zb["schedule"]) == ("1f1b", "zb-h1")
    for row in (base, zb):
        for part in ("measured", "predicted"):
            got = row[part]
            assert len(got["busy_s"]) == len(got["bubble_s"]) == 2
            assert all(b > 0 for b in got["busy_s"]) and all(x >= 0 for x in got["bubble_s"])
            assert all(b + x == pytest.approx(got["schedule_s"]) for b, x in zip(got["busy_s"], got["bubble_s"]))
            # ZB-H1's weight gradients ran (and are priced) as W ops where a stage holds them back (rank
            # 1); rank 0 fuses each W into its B (planner.schedules.inline_w), counted as B; 1F1B has none
            assert [k["W"] > 0 for k in got["op_s"]] == [False, row["schedule"] == "zb-h1"], got["op_s"]
            assert all(k["F"] > 0 and k["B"] > 0 for k in got["op_s"]), (part, got["op_s"])
        assert all(m > 0 for m in row["measured"]["memory_gib"]) and row["step_error"] is not None
        assert all(0 < t < m for t, m in zip(row["predicted"]["tensor_gib"], row["predicted"]["memory_gib"]))
    assert base["bubble_reduction"] == 0.0 and zb["bubble_reduction"] is not None


def test_settings_parse_and_a_bad_one_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert [s.label for s in parse_runs("1f1b, zb-h1:16", 8)] == ["1f1b m=8", "zb-h1 m=16"]
    assert [s.label for s in parse_runs("1f1b,interleaved-1f1b", 8)] == ["1f1b m=8", "interleaved-1f1b m=8"]
    for bad, said in (("zb-h1:x", "micro-batches 'x' is not a positive integer"),
                      ("interleaved-1f1b:3", "micro_batches a multiple of the 2 stages"), ("zb-h2", "unknown schedule"),
                      ("zb-h1:5", "micro_batches")):  # 5 micro-batches of the smoke's batch of 4
        with pytest.raises(SystemExit):
            main(["--smoke", "--runs", bad, "--out", str(tmp_path / "out")])
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert said in err, err


def test_layers_pin_the_split_and_a_bad_one_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert parse_layers("8, 8,5,3", 4, 24) == [8, 8, 5, 3]
    for bad in ("8,8,5", "8,8,5,4", "8,8,8,0", "8,8,x,3", "8,8,-5,13"):
        with pytest.raises(SpecError, match=r"--layers: .* is not 4 positive layer counts summing to the model's 24 "
                           r"layers \(hint: write one count per stage, e.g. --layers 6,6,6,6\)"):
            parse_layers(bad, 4, 24)
    with pytest.raises(SystemExit):  # refused before anything launches (the smoke: 2 stages of tiny-8l)
        main(["--smoke", "--layers", "4,3", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--layers: '4,3' is not 2 positive layer counts summing to the model's 8 layers" in err, err


def test_the_split_is_balanced_on_this_hosts_share_calibration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``calibrate --sm-percent 50`` on this host: its slower 50 % tables, not the shipped ones, split the
    layers (and the program says which entry priced each GPU type)."""
    model, devices = resolve_model("llama-1.3b", 2048), ["fast:0", "fast:1", "slow:0", "slow:1"]
    monkeypatch.setenv("HEXISCALE_HOME", str(tmp_path / "empty"))
    cluster = load_cluster(CLUSTER)
    assert priced_from(cluster)["h100-sxm-mps50"] == "h100-sxm-mps50"
    shipped = balanced_counts(cluster, model, devices, 16, 8)
    host_share(tmp_path / "home", slower=1.5)
    monkeypatch.setenv("HEXISCALE_HOME", str(tmp_path / "home"))
    cluster = load_cluster(CLUSTER)
    assert priced_from(cluster) == {"h100-sxm": "h100-sxm-measured", "h100-sxm-mps50": "h100-sxm-mps50-measured"}
    host = balanced_counts(cluster, model, devices, 16, 8)
    assert sum(host) == sum(shipped) == 24 and sum(host[2:]) < sum(shipped[2:])


def test_predictions_take_the_calibration_estimate_takes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The program prices with what ``hexiscale estimate`` resolves (planner.calibration.local):
    the packaged H100 calibration here, not the bare default terms."""
    from benchmarks.executor.bubbles import Setting, make_plan, predicted, priced
    from planner.calibration.local import resolve_profiles
    from planner.catalog import _cached
    from planner.cost import estimate
    from planner.cost.params import DEFAULT_PARAMS

    monkeypatch.setenv("HEXISCALE_HOME", str(tmp_path / "empty-home"))
    _cached.cache_clear()
    try:
        cluster = load_cluster(CLUSTER)
        terms = priced(cluster).params
        assert terms == resolve_profiles(cluster).profiles.params and terms != DEFAULT_PARAMS
        model = resolve_model("llama-1.3b")
        devices = [d.id for d in cluster.devices]
        plan = make_plan(model, devices, [8, 8, 5, 3], 16, Setting("1f1b", 8), cluster.name)
        got = predicted(plan, cluster)
        assert got["step_s"] == estimate(plan, cluster, resolve_profiles(cluster).profiles).step_time_s
        assert got["step_s"] != estimate(plan, cluster).step_time_s  # the bare terms price it otherwise
    finally:
        _cached.cache_clear()

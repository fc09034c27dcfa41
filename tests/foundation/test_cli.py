"""The foundation's CLI commands, run in-process through the console-script entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hexiscale.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
CLUSTERS = sorted((ROOT / "examples" / "clusters").glob("*.yaml"))
PLANS = sorted((ROOT / "examples" / "plans").glob("*.json"))


def test_validate_every_example_prints_ok(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", *map(str, CLUSTERS + PLANS)]) == 0
    out = capsys.readouterr().out
    assert out.count(": OK") == len(CLUSTERS) + len(PLANS)


def test_validate_plan_against_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    plan = ROOT / "examples" / "plans" / "demo-cpu-6-tiny.json"
    assert main(["validate", str(plan), "--cluster", str(ROOT / "examples/clusters/demo-cpu-6.yaml")]) == 0
    assert main(["validate", str(plan), "--cluster", str(ROOT / "examples/clusters/h20-h800.yaml")]) == 1
    err = capsys.readouterr().err
    assert "pipelines[0].stages[0].devices[0]" in err and "hint" in err


def test_validate_broken_cluster_prints_path_and_hint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes:\n  - {name: a, gpu: a100, gpus: 2, intra_link: {bandwidth_GBps: -1}}\n"
                   "inter_node: {bandwidth_GBps: 1}\n")
    assert main(["validate", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "nodes[0].intra_link.bandwidth_GBps" in err and "hint" in err and str(bad) in err
    assert "Traceback" not in err


def test_show_plan_and_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    plan = ROOT / "examples" / "plans" / "demo-cpu-6-tiny.json"
    assert main(["show", str(plan), "--cluster", str(ROOT / "examples/clusters/demo-cpu-6.yaml")]) == 0
    out = capsys.readouterr().out
    assert "r4090:1-2" in out and "micro-batches" in out and "rtx4090" in out
    assert main(["show", str(ROOT / "examples/clusters/seed-uneven-nodes.yaml")]) == 0
    assert "r4090s-1" in capsys.readouterr().out


def test_convert_both_ways(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = ROOT / "examples" / "plans" / "demo-cpu-6-tiny.json"
    cluster = str(ROOT / "examples/clusters/demo-cpu-6.yaml")
    assert main(["convert", "--to-flags", str(plan), "--cluster", cluster]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith('--hetero_configs "[[2], [1, 2, 1]]"')
    out = tmp_path / "p.json"
    assert main(["convert", "--from-flags", "--cluster", cluster, "--model", "tiny", "--dtype", "fp32",
                 "--hetero_configs", "[[2], [1, 2, 1]]", "--layer_partitions", "[[4], [1, 2, 1],]",
                 "--global_bsz_size", "5", "3", "--chunks", "2", "3",
                 "--devices_id", "[[[0, 0]], [[1], [1, 1], [1]]]", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["pipelines"] == json.loads(plan.read_text())["pipelines"]


def test_devices_lists_catalog(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices"]) == 0
    assert "rtx3080ti" in capsys.readouterr().out


def test_train_flags_become_a_checked_config(capsys: pytest.CaptureFixture[str]) -> None:
    """``hexiscale train`` hands the executor a typed TrainConfig; bad values are one error line."""
    from hexiscale.cli.main import build_parser
    from hexiscale.cli.train_args import train_config

    args = build_parser().parse_args(["train", "--plan", "p.json", "--steps", "7", "--lr", "0.01", "--zero", "1"])
    config = train_config(args)
    assert (config.layout.plan, config.run.steps, config.optim.lr, config.layout.seed_layout.given()) == \
        ("p.json", 7, 0.01, [])
    assert main(["train", "--plan", "p.json", "--log-every", "0"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --log-every") and "\n" not in err


def test_a_plan_checked_against_another_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A plan made for cluster 'demo-cpu-6': against another cluster holding its devices it passes
    with one warning line naming both clusters; against one lacking them the error names the plan's."""
    plan = str(ROOT / "examples" / "plans" / "demo-cpu-6-tiny.json")
    twin = tmp_path / "lab-b.yaml"
    twin.write_text((ROOT / "examples/clusters/demo-cpu-6.yaml").read_text().replace("name: demo-cpu-6", "name: lab-b"))
    for command in (["validate", plan], ["show", plan], ["estimate", plan]):
        assert main([*command, "--cluster", str(twin)]) == 0
        err = capsys.readouterr().err.strip()
        assert err == ("warning: the plan was made for cluster 'demo-cpu-6' but is checked against cluster 'lab-b' "
                       "(pass demo-cpu-6's file as --cluster if that is what you meant)"), command
    assert main(["validate", plan, "--cluster", str(ROOT / "examples/clusters/h20-h800.yaml")]) == 1
    assert "the plan was made for cluster 'demo-cpu-6'" in capsys.readouterr().err


def test_a_plans_cluster_name_is_never_a_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``cluster: "../../../base"`` would have read base.yaml three folders above the plan."""
    (tmp_path / "base.yaml").write_text((ROOT / "examples/clusters/demo-cpu-6.yaml").read_text())
    folder = tmp_path / "a" / "b" / "c"
    folder.mkdir(parents=True)
    doc = json.loads((ROOT / "examples/plans/demo-cpu-6-tiny.json").read_text())
    for name in ("../../../base", "/etc/base", "sub/base"):
        doc["cluster"] = name
        (folder / "p.json").write_text(json.dumps(doc))
        assert main(["estimate", str(folder / "p.json")]) == 1
        err = capsys.readouterr().err
        assert f"cluster: {name!r} is not a plain cluster name" in err and "--cluster" in err

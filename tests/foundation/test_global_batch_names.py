"""One meaning per batch flag (issue 30): ``--global-batch-size`` is the total samples per step in
every command (plan, whatif, convert, train), each pipeline's batch is ``--pipeline-batch-sizes``
(the seeds' ``--global_bsz_size`` / ``--global_batch_size`` keep their per-pipeline meaning), and an
old line whose ``--global-batch-size`` meant the per-pipeline list stops with one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hexiscale.cli.main import main

TWO_PIPES = ["--model", "tiny", "--hetero_configs", "[[1], [1]]", "--layer_partitions", "[[4], [4]]",
             "--devices_id", "[[[0]], [[0]]]", "--pipeline-micro-batches", "1"]
ONE_PIPE = ["--model", "tiny", "--hetero_configs", "[[1]]", "--layer_partitions", "[[4]]",
            "--devices_id", "[[[0]]]", "--chunks", "1"]


def _convert(argv: list[str], tmp_path: Path) -> dict:
    out = tmp_path / "plan.json"
    assert main(["convert", "--from-flags", *argv, "-o", str(out)]) == 0
    return json.loads(out.read_text())


def _batches(plan: dict) -> tuple[int, list[int]]:
    return plan["global_batch_size"], [p["batch_size"] for p in plan["pipelines"]]


@pytest.mark.parametrize(("batch", "want"), [
    (["--pipeline-batch-sizes", "4", "2"], (6, [4, 2])),
    (["--global_bsz_size", "4"], (8, [4, 4])),  # the seed's flag: per pipeline, a short list padded
    (["--global_batch_size", "4"], (8, [4, 4])),
    (["--global-batch-size", "6", "--pipeline-batch-sizes", "4", "2"], (6, [4, 2])),
    (["--pipeline-batch-sizes", "4", "2", "--global-batch-size", "6"], (6, [4, 2])),
])
def test_per_pipeline_and_total_batch(batch: list[str], want: tuple[int, list[int]], tmp_path: Path) -> None:
    assert _batches(_convert([*TWO_PIPES, *batch], tmp_path)) == want


@pytest.mark.parametrize("flag", ["--global-batch-size", "--global-batch"])
def test_one_pipeline_total_is_its_batch(flag: str, tmp_path: Path) -> None:
    assert _batches(_convert([*ONE_PIPE, flag, "8"], tmp_path)) == (8, [8])


@pytest.mark.parametrize(("batch", "says"), [
    # the old per-pipeline reading would train 8 + 8 = 16 samples a step
    (["--global-batch-size", "8"], "error: --global-batch-size: 8 is the total samples per step, but the "
     "layout's 2 pipeline(s) take 8 8 = 16 (hint: give each pipeline's batch with --pipeline-batch-sizes"),
    (["--global-batch-size", "9", "--pipeline-batch-sizes", "4", "4"], "error: --global-batch-size: 9 is the total"),
    # a list: argparse's extra value, named with the flag's meaning (a usage error: exit 2)
    (["--global-batch-size", "4", "4"], "error: --global-batch-size: takes one value, and '4' follows it (hint: "
     "--global-batch-size: samples per step, the total over every pipeline (one number; each pipeline's is "
     "--pipeline-batch-sizes))"),
])
def test_the_old_per_pipeline_meaning_stops_in_one_line(batch: list[str], says: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["convert", "--from-flags", *TWO_PIPES, *batch]) == (2 if "takes one value" in says else 1)
    err = capsys.readouterr().err.strip()
    assert err.startswith(says) and "\n" not in err, err


def test_train_refuses_the_total_beside_a_plan(capsys: pytest.CaptureFixture[str]) -> None:
    """Seed-style layout flags are refused with --plan; the total is one of them (named as typed)."""
    pytest.importorskip("torch")  # train's ranks need it (the Python 3.12 planner leg has none)
    plan = Path(__file__).resolve().parents[2] / "examples" / "plans" / "demo-cpu-4-tiny.json"
    assert main(["train", "--plan", str(plan), "--global-batch-size", "4", "--device", "cpu"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.endswith("error: --global-batch-size: given together with --plan (hint: use either --plan or the "
                        "seed-style flags)") and "\n" not in err, err


CPU6 = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("flag", ["--global-batch-size", "--global-batch"])
def test_plan_and_whatif_take_the_total_under_one_name(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = str(CPU6 / "clusters" / "demo-cpu-6.yaml")
    assert main(["plan", cluster, "--model", "tiny", flag, "8", "--json", "--time-limit", "20"]) == 0
    assert json.loads(capsys.readouterr().out)["global_batch_size"] == 8
    plan = str(CPU6 / "plans" / "demo-cpu-6-tiny.json")
    assert main(["whatif", plan, "--cluster", cluster, flag, "12", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["changes"] == ["global batch 8 -> 12"]


def test_a_missing_total_names_the_new_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(CPU6 / "clusters" / "demo-cpu-6.yaml"), "--model", "tiny"]) == 1
    assert capsys.readouterr().err.startswith("error: --global-batch-size: missing")

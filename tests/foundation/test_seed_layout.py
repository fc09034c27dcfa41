"""A seed user's launch line as typed (issue 18): model size and layer count, accumulation and run
iterations, launcher flags, and a layout on this machine without a cluster file."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from executor.train.config import FLAT_NAMES
from hexiscale.cli.main import main
from hexiscale.cli.train_args import add_train_arguments, relaunched, train_argv, train_config
from planner.errors import SpecError
from planner.hf_config import resolve_model
from planner.seed_layout import SeedLayout

SEED_LINE = ["--model-size", "llama-7b", "--layer-num", "4", "--micro_batch_num", "1", "--global_batch_size", "1",
             "--hetero_configs", "[[1, 2, 1],]", "--layer_partitions", "[[1, 2, 1]]",
             "--devices_id", "[[[0], [0, 0], [0]],]", "--accum-iter", "2", "--run-iter", "10",
             "--master_addr", "10.0.0.1", "--master_port", "29500", "--current_device", "0"]


def test_convert_the_seed_line_as_typed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    assert main(["convert", "--from-flags", *SEED_LINE, "-o", str(out)]) == 0
    plan = json.loads(out.read_text())
    want = {**resolve_model("llama2-7b").to_dict(), "name": "llama2-7b-L4", "num_layers": 4}
    assert plan["model"] == want and "cluster" not in plan
    (pipe,) = plan["pipelines"]
    assert (pipe["batch_size"], pipe["micro_batches"], plan["global_batch_size"]) == (2, 2, 2)  # x accum-iter
    assert [(s["devices"], s["tp"], s["layers"]) for s in pipe["stages"]] == [
        (["local:0"], 1, [0, 1]), (["local:1", "local:2"], 2, [1, 3]), (["local:3"], 1, [3, 4])]
    err = capsys.readouterr().err
    assert "--run-iter 10: 5 optimizer steps" in err and "x 2" in err and "--current_device" in err


@pytest.mark.parametrize("changes, field", [
    ({"devices_id": "[[[0], [0, 1], [0]]]"}, "--devices_id[0][1][1]"),  # node 1 without a cluster file
    ({"model": "tiny"}, "--model-size"),  # the model twice
    ({"run_iter": 1}, "--run-iter"),  # fewer iterations than one accumulation
    ({"accum_iter": 0}, "--accum-iter"),
    ({"model_size": None}, "--model"),
    ({"layer_num": 3}, "--layer_partitions[0]"),  # the partition no longer covers the model
])
def test_seed_line_errors_name_the_flag(changes: dict, field: str) -> None:
    base = dict(hetero_configs="[[1, 2, 1]]", layer_partitions="[[1, 2, 1]]", global_bsz_size=("1",), chunks=("1",),
                devices_id="[[[0], [0, 0], [0]]]", model_size="llama-7b", layer_num=4, accum_iter=2, run_iter=10)
    with pytest.raises(SpecError) as info:
        layout = SeedLayout(**{**base, **changes})
        layout.plan(None)
        layout.steps()
    assert info.value.path == field, str(info.value)


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    return parser.parse_args(argv)


def test_train_flags_steps_and_round_trip() -> None:
    assert train_config(_parse(SEED_LINE)).run.steps == 5
    assert train_config(_parse([])).run.steps == 10
    with pytest.raises(SpecError, match="--run-iter: given together with --steps"):
        train_config(_parse([*SEED_LINE, "--steps", "3"]))
    argv = ["--cluster", "c.yaml", "--steps", "7", "--data", "d", "--seed", "3", "--lr", "0.001", "--min-lr", "1e-05",
            "--warmup", "2", "--weight-decay", "0.05", "--clip", "0.5", "--checkpoint-dir", "ck", "--save-every", "2",
            "--resume", "r", "--log-jsonl", "m.jsonl", "--log-every", "3", "--tensorboard", "tb", "--trace", "t.json",
            "--trace-steps", "2", "--heartbeat", "0.5", "--dead-after", "9", "--hang-after", "99",
            "--startup-timeout", "60", "--pg-timeout", "400"]
    config = train_config(_parse(argv))
    assert train_config(_parse(train_argv(config))) == config
    travels = {name for name, _, _ in relaunched(config)}  # every field travels, but the plan, device and seed layout
    assert travels | {"layout.plan", "run.device", "layout.seed_layout"} == set(FLAT_NAMES.values())

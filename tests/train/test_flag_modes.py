"""Every ``hexiscale train`` flag in every mode (plan, strategy pool, elastic) takes effect or is
refused in one line naming the flag and the mode: none is silently dropped (issue 30).

The walk is over the parser itself, so a new flag without a row in :mod:`executor.train.flag_modes`
(and a sample value here) fails. "Takes effect" is checked where the loop gets it: the config the
loop receives holds the value, the code of that mode's loop reads it, and the plan-option flags
are in the resolved plan's options; one run checks that the engine trains the rewritten plan.
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
from pathlib import Path
from typing import Any

import pytest

from executor.data import pool_source
from executor.switch import elastic as elastic_train
from executor.switch import elastic_switch
from executor.train import entry as train
from executor.train import flag_modes, plan_runner, pool_runner, preflight
from executor.train import loop as train_loop
from executor.train import setup as train_setup
from executor.train.config import TrainConfig
from executor.train.flag_modes import FLAGS, MODES, value_of
from executor.train.setup import resolve_plan
from hexiscale.cli.train_args import add_train_arguments, train_config
from planner.errors import SpecError

ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "examples" / "plans" / "demo-cpu-4-tiny.json"
POOL = ROOT / "tests" / "data" / "pool-tiny-h100x4.json"
CLUSTER = ROOT / "examples" / "clusters" / "h100x4.yaml"
BASE = {"plan": ["--plan", str(PLAN)], "elastic": ["--plan", str(PLAN)],
        "pool": ["--plan", str(POOL), "--cluster", str(CLUSTER), "--step-tokens", "4096"]}
BASE["elastic_pool"] = BASE["pool"]
# a value other than the default for every flag (dest -> the values after the flag; --plan is in BASE)
SAMPLE: dict[str, list[str]] = {
    "plan": [], "cluster": [str(ROOT / "examples" / "clusters" / "demo-cpu-6.yaml")], "model": ["tiny"],
    "seq_len": ["16"], "recompute": ["full"], "zero": ["1"], "dtype": ["fp16"], "hetero_configs": ["[[1]]"],
    "layer_partitions": ["[[4]]"], "global_bsz_size": ["4"], "total": ["4"], "chunks": ["2"], "devices_id": ["[[[0]]]"],
    "model_size": ["tiny"], "layer_num": ["2"], "accum_iter": ["2"], "run_iter": ["6"], "master_addr": ["10.0.0.1"],
    "master_port": ["7"], "current_device": ["1"], "steps": ["7"], "stop_at": ["3"], "data": ["corpus"],
    "synthetic": [], "seed": ["5"], "lr": ["0.01"], "min_lr": ["0.0001"], "warmup": ["1"], "weight_decay": ["0.2"],
    "clip": ["2"], "device": ["cpu"], "compile": [], "step_tokens": ["8192"], "lengths": ["synthetic:github"],
    "assign": ["threshold"], "checkpoint_dir": ["ck"], "save_every": ["2"], "async_save": [], "resume": ["ck"],
    "log_jsonl": ["m.jsonl"], "log_every": ["2"], "tensorboard": ["tb"], "trace": ["t.json"], "trace_steps": ["2"],
    "on_nonfinite": ["skip"], "heartbeat": ["2"], "dead_after": ["40"], "hang_after": ["900"],
    "startup_timeout": ["60"], "pg_timeout": ["2400"],
}
SAMPLE_IN = {("cluster", "pool"): [str(CLUSTER)], ("cluster", "elastic_pool"): [str(CLUSTER)]}  # the pool's own cluster
# the name the loops read a field by, where it is another (RunSection.end: --stop-at, else --steps)
READ_AS = {"stop_at": "run.end"}
# the code each mode's loop runs (besides the checks every mode shares); a flag it honours is read there
LOOP: dict[str, list[Any]] = {
    "plan": [train.run_training, train._train, train._plan_runner, train_loop, plan_runner, train_setup],
    "pool": [train.run_training, train._train, train._pool_runner, train_loop, pool_runner, pool_source, train_setup],
    "elastic": [elastic_train, elastic_switch, train_loop, plan_runner, train_setup],
    "elastic_pool": [elastic_train, elastic_switch, train_loop, pool_runner, pool_source, train_setup],
}
# made in pre-flight for every mode (the data source, the torch device): the loop takes them from there
VIA_PREFLIGHT = {"data": "source", "device": "device"}
# read by the CLI before the config (the environment's rendezvous fallbacks; --synthetic is no --data)
CLI_ONLY = {"master_addr", "master_port", "current_device", "synthetic"}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_train_arguments(p)
    return p


def _dests() -> list[str]:
    return [a.dest for a in _parser()._actions if a.dest != "help"]


def _source(parts: list[Any]) -> str:
    return "\n".join(inspect.getsource(p) for p in parts)


def test_every_flag_has_a_row_and_a_sample() -> None:
    dests = _dests()
    assert sorted(set(dests) - set(FLAGS)) == [], "add the new flag's row to executor/train/flag_modes.py"
    assert sorted(set(FLAGS) - set(dests)) == []
    assert sorted(set(dests) - set(SAMPLE)) == []
    for dest in dests:  # the row names the flag as the parser spells it
        assert FLAGS[dest].flag in next(a.option_strings for a in _parser()._actions if a.dest == dest)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dest", [d for d in _dests()])
def test_flag_takes_effect_or_is_refused(dest: str, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    row = FLAGS[dest]
    given = [] if dest == "plan" else [row.flag, *SAMPLE_IN.get((dest, mode), SAMPLE[dest])]
    args = _parser().parse_args([*BASE[mode], *given])
    try:
        config = train_config(args)
        resolved = resolve_plan(config, elastic=mode.startswith("elastic"))
    except SpecError as exc:  # refused: one line naming the flag (and the mode, where the mode is why)
        text = str(exc)
        assert "\n" not in text and exc.path == row.flag, text
        assert mode in row.refuse, f"{row.flag} is refused in {mode} but its row says it is honoured: {text}"
        if not row.seed:
            assert flag_modes.MODE_WORDS[mode] in text and row.refuse[mode] in text
        return
    assert mode not in row.refuse, f"{row.flag} is neither refused nor honoured in {mode}"
    if dest in CLI_ONLY:
        return
    assert row.attr is not None
    # the config the loop gets holds the value, and the mode's loop reads it
    if row.flag not in BASE[mode]:
        default = _parser().parse_args(BASE[mode])
        assert value_of(config, row.attr) != value_of(train_config(default), row.attr)
    if dest in flag_modes.OPTION_FLAGS and mode == "plan":
        plan = resolved[0]
        assert getattr(plan.options, dest) == value_of(config, row.attr)
        return
    name = re.escape(READ_AS.get(dest, row.attr))
    if dest == "run_iter":  # it gives --steps
        assert config.run.steps == 6
        return
    loop = _source(LOOP[mode])
    if dest in VIA_PREFLIGHT:  # pre-flight makes it (every mode), the loop takes pre-flight's
        assert re.search(rf"\bargs\.{name}\b", inspect.getsource(preflight.local_checks))
        assert re.search(rf"\bargs\.{name}\b|\bprep\.{VIA_PREFLIGHT[dest]}\b", loop), f"the {mode} loop drops it"
        return
    assert re.search(rf"\bargs\.{name}\b", loop), f"the {mode} loop never reads {row.attr}"


def test_plan_option_flags_rewrite_the_plan_and_say_so(capsys: pytest.CaptureFixture[str]) -> None:
    lines: list[str] = []
    plan, _, _ = resolve_plan(TrainConfig.flat(plan=str(PLAN), zero=1, recompute="full", dtype="bf16", compile=True),
                              say=lines.append)
    assert (plan.options.zero, plan.options.recompute, plan.options.dtype, plan.options.compile) == \
        (1, "full", "bf16", True)
    assert lines == ["--recompute, --zero, --dtype, --compile replaced the plan's options.recompute none -> full, "
                     "options.zero 0 -> 1, options.dtype fp32 -> bf16, options.compile False -> True"]
    lines.clear()
    plan, _, _ = resolve_plan(TrainConfig.flat(plan=str(PLAN), dtype="fp32", zero=1), say=lines.append)
    assert lines == ["--zero replaced the plan's options.zero 0 -> 1"]  # --dtype fp32 is the plan's own


def test_plan_option_flags_are_checked_as_the_plan(tmp_path: Path) -> None:
    data = json.loads(PLAN.read_text())
    data["options"] = {"dtype": "bf16", "residual_dtype": "bf16"}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(SpecError, match="residual_dtype") as err:
        resolve_plan(TrainConfig.flat(plan=str(path), dtype="fp32"))
    assert err.value.path == "--dtype" and "\n" not in str(err.value)


def test_zero_flag_reaches_the_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """End to end on one rank: ``--plan p.json --zero 1 --recompute full --dtype fp32`` builds the
    engine of the rewritten plan (today's bug: the plan's own options, silently)."""
    from hexiscale.cli.main import main

    data = json.loads(PLAN.read_text())
    data["global_batch_size"] = 2
    data["pipelines"] = [dict(data["pipelines"][0], batch_size=2, micro_batches=1)]
    data["options"] = {"dtype": "bf16", "zero": 0, "recompute": "none"}
    path = tmp_path / "one.json"
    path.write_text(json.dumps(data))
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "HEXISCALE_FAULT",
                "HEXISCALE_ELASTIC"):
        monkeypatch.delenv(key, raising=False)
    built = []
    real = plan_runner.Engine

    def engine(plan, *a, **kw):  # type: ignore[no-untyped-def]
        built.append(plan.options)
        return real(plan, *a, **kw)

    monkeypatch.setattr(plan_runner, "Engine", engine)
    assert main(["train", "--plan", str(path), "--zero", "1", "--recompute", "full", "--dtype", "fp32",
                 "--steps", "1", "--device", "cpu"]) == 0
    assert [(o.zero, o.recompute, o.dtype) for o in built] == [(1, "full", "fp32")]
    assert "--recompute, --zero, --dtype replaced the plan's options.recompute none -> full, options.zero 0 -> 1, " \
           "options.dtype bf16 -> fp32" in capsys.readouterr().out


def test_the_launcher_refuses_what_its_ranks_would() -> None:
    """``hexiscale launch ... -- FLAGS`` says it once, before any rank starts."""
    from hexiscale.cli.launch_train_args import checked_train_args

    with pytest.raises(SpecError, match="^--zero: not available with an elastic job"):
        checked_train_args(["--zero", "1"], plan_path=str(PLAN), mode="elastic")
    with pytest.raises(SpecError, match="^--trace: not available with a strategy pool"):
        checked_train_args(["--step-tokens", "4096", "--trace", "t.json"], plan_path=str(POOL), mode="pool")
    assert checked_train_args(["--zero", "1"], plan_path=str(PLAN)) == ["--zero", "1"]
    # an elastic job on a pool takes the mixed-length flags and refuses what a pool or an elastic job refuses
    assert checked_train_args(["--step-tokens", "4096"], plan_path=str(POOL), mode="elastic_pool") == \
        ["--step-tokens", "4096"]
    with pytest.raises(SpecError, match="^--zero: not available with an elastic job on a strategy pool"):
        checked_train_args(["--step-tokens", "4096", "--zero", "1"], plan_path=str(POOL), mode="elastic_pool")


def test_an_elastic_trace_refuses_a_stop_before_its_last_change(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """``--stop-at`` acts in an elastic job; one that stops before a trace's change would leave the
    joining devices waiting for a switch that never comes."""
    from hexiscale.cli.main import main

    trace = tmp_path / "t.yaml"
    trace.write_text("phases:\n  - steps: 2\n  - steps: 3\n    devices: [a100:0, r4090:3]\n")
    cluster = str(ROOT / "examples" / "clusters" / "demo-cpu-6.yaml")
    assert main(["launch", str(PLAN), "--local", "--device", "cpu", "--trace", str(trace), "--cluster", cluster,
                 "--", "--stop-at", "2"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == "error: --stop-at: 2, but the trace changes the devices after step 2 (hint: pass --stop-at 3 " \
                  "or more, or end the trace sooner)"

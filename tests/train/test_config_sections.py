"""The sectioned train config (issue 30): every field declared once, the ``train`` parser and the
table of flags per mode generated from the declarations, the old flat names still build a config."""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import fields
from pathlib import Path

import pytest

from executor.train.config import FLAT_NAMES, SECTIONS, TrainConfig, renames_text
from executor.train.config_option import opt_of
from executor.train.flag_modes import FLAGS
from hexiscale.cli.train_args import add_train_arguments, train_argv, train_config
from planner.errors import SpecError

ROOT = Path(__file__).resolve().parents[2]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_train_arguments(p)
    return p


def test_one_option_per_declared_field() -> None:
    """Every field has one flag of its own in the generated parser, or says why it has none; no
    flag is declared twice, and the parser has no option that no declaration made."""
    actions = [a for a in _parser()._actions if a.dest != "help"]
    strings = Counter(s for a in actions for s in a.option_strings)
    assert [s for s, n in strings.items() if n > 1] == []
    dests = Counter(a.dest for a in actions)
    assert [d for d, n in dests.items() if n > 1] == []
    declared = []
    for section, cls in SECTIONS.items():
        for f in fields(cls):
            o = opt_of(f)
            if o is None:
                assert f.metadata.get("internal"), f"{section}.{f.name}: declare its flag, or internal(why)"
                continue
            declared.append(o.dest)
            (action,) = [a for a in actions if a.dest == o.dest]
            assert action.option_strings[0] == o.flag and action.help == o.help
    assert len(declared) == len(set(declared))
    assert set(dests) == set(FLAGS)  # the mode table has a row for every option, and only those


def test_parser_defaults_are_the_fields_defaults() -> None:
    config = train_config(_parser().parse_args([]))
    assert config == TrainConfig()
    assert config.run.steps == 10  # --steps is left unset by argparse (the seed's --run-iter may give it)


def test_flat_names_build_the_same_config() -> None:
    flat = TrainConfig.flat(plan="p.json", steps=7, lr=0.01, checkpoint_dir="ck", data="d.bin", heartbeat=2.0,
                            dead_after=10.0, step_tokens=4096, log_every=3)
    assert (flat.layout.plan, flat.run.steps, flat.optim.lr, flat.checkpoint.dir, flat.data.path) == \
        ("p.json", 7, 0.01, "ck", "d.bin")
    assert (flat.faults.heartbeat, flat.faults.dead_after, flat.varlen.step_tokens, flat.metrics.log_every) == \
        (2.0, 10.0, 4096, 3)
    assert train_config(_parser().parse_args(["--plan", "p.json", *train_argv(flat)])) == flat
    with pytest.raises(TypeError, match="checkpoint_every"):
        TrainConfig.flat(checkpoint_every=3)


def test_checks_cross_sections_and_name_the_flag() -> None:
    with pytest.raises(SpecError, match="^--warmup: 20 warm-up steps, more than the run's --steps 10"):
        TrainConfig.flat(warmup=20)
    with pytest.raises(SpecError, match="^--min-lr: must be <= 0.001"):
        TrainConfig.flat(lr=1e-3, min_lr=1e-2)
    with pytest.raises(SpecError, match="^--assign: 'random' is not one of cost, threshold"):
        TrainConfig.flat(assign="random")


def test_renames_file_is_current() -> None:
    """CONFIG_RENAMES.txt (for porting code written against the flat config) lists every field."""
    assert (ROOT / "CONFIG_RENAMES.txt").read_text() == renames_text()
    assert sorted(FLAT_NAMES) == sorted(set(FLAT_NAMES))
    for dotted in FLAT_NAMES.values():
        section, name = dotted.split(".")
        assert name in {f.name for f in fields(SECTIONS[section])}

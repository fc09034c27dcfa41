"""Command-line arguments of ``hexiscale train``, generated from the config's declarations, and the
:class:`TrainConfig` they make; no torch here.

Every option comes from one field's declaration in :mod:`executor.train.config_sections` (flag, help,
type, choices, default; :mod:`executor.train.config_option`), in the help group the field names; the
seed-style flags come from :mod:`planner.seed_layout`. Nothing here names a flag of its own.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import fields
from typing import Any

from executor.train.config import SECTIONS, TrainConfig
from executor.train.config_option import Opt, opt_of, options
from planner.errors import SpecError
from planner.seed_layout import SeedLayout


def _add(group: argparse._ArgumentGroup | argparse._MutuallyExclusiveGroup, o: Opt, default: Any) -> None:
    if o.switch:
        group.add_argument(o.flag, action="store_true", dest=o.dest, help=o.help)
        return
    kw: dict[str, Any] = {"default": None if o.unset else default, "help": o.help, "dest": o.dest}
    kw.update({k: v for k, v in (("type", o.type), ("choices", o.choices), ("metavar", o.metavar)) if v is not None})
    group.add_argument(o.flag, **kw)


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    groups: dict[str, argparse._ArgumentGroup] = {}

    def group(title: str) -> argparse._ArgumentGroup:
        if title not in groups:
            groups[title] = p.add_argument_group(title)
        return groups[title]

    for cls in SECTIONS.values():
        for f in fields(cls):
            o = opt_of(f)
            if o is None:
                if f.metadata.get("cli") is not None:
                    f.metadata["cli"](group(cls.GROUP))
                continue
            g = group(o.group or cls.GROUP)
            if o.alternative is not None:
                both = g.add_mutually_exclusive_group()
                _add(both, o, f.default)
                _add(both, o.alternative, False)
            else:
                _add(g, o, f.default)


def train_config(args: argparse.Namespace) -> TrainConfig:
    """The typed config of parsed ``hexiscale train`` arguments."""
    layout = SeedLayout.from_args(args)
    seed_steps = layout.steps()
    if seed_steps is not None and args.steps is not None:
        raise SpecError("--run-iter", "given together with --steps", "use one of them")
    if seed_steps is not None:
        args = argparse.Namespace(**{**vars(args), "steps": seed_steps})
    sections: dict[str, Any] = {}
    for name, cls in SECTIONS.items():
        kw: dict[str, Any] = {}
        for f in fields(cls):
            o = opt_of(f)
            if o is not None:
                value = getattr(args, o.dest)
                if not (o.unset and value is None):
                    kw[f.name] = value
            elif f.metadata.get("build") is not None:
                kw[f.name] = f.metadata["build"](args)
        sections[name] = cls(**kw)
    return TrainConfig(**sections)


def relaunched(config: TrainConfig) -> Iterator[tuple[str, Opt, Any]]:
    """``(dotted field, opt, value)`` of every field ``train_argv`` repeats."""
    for name in SECTIONS:
        section = getattr(config, name)
        for f, o in options(section):
            if o.relaunch:
                yield f"{name}.{f.name}", o, getattr(section, f.name)


def train_argv(config: TrainConfig) -> list[str]:
    """The ``hexiscale train`` arguments that make ``config`` again, less ``--plan``, ``--device``
    and the seed layout (for a launcher that adds its own plan file and device)."""
    out: list[str] = []
    for _, o, value in relaunched(config):
        if isinstance(value, bool):
            out += [o.flag] if value else []
        elif value is not None:
            out += [o.flag, repr(value) if isinstance(value, float) else str(value)]
    return out


def path_dests() -> frozenset[str]:
    """The dests of the flags whose value is a path (a ``--lengths`` value may also be synthetic:NAME)."""
    return frozenset(o.dest for cls in SECTIONS.values() for _, o in options(cls) if o.path)

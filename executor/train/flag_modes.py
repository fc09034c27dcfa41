"""Which ``hexiscale train`` flag each mode honours: the one table (no torch).

The modes are what the one training loop (:mod:`executor.train.loop`) runs: ``plan`` (a plan file,
or the seed-style flags that make one; :mod:`executor.train.plan_runner`), ``pool`` (a strategy pool as
``--plan``; :mod:`executor.train.pool_runner`), ``elastic`` (a plan under an elastic supervisor;
:mod:`executor.switch.elastic`) and ``elastic_pool`` (a strategy pool under one: it refuses what a
pool refuses and what an elastic job refuses, but takes the mixed-length flags). A flag not in
a mode's ``refuse`` is honoured there; where a mode cannot honour a flag that was given, training
stops before its first step with one line naming the flag, the mode and what to do instead
(:func:`check_flags`). A flag counts as given when its value differs from the config's default (a
default is what every mode does anyway).

The plan-option flags (``--recompute``, ``--zero``, ``--dtype``, ``--compile``) are the plan's
``options``: with a plan file they rewrite them (:func:`apply_option_flags`, checked as the plan's
own options are), and rank 0 says which ones they replaced.

The table is derived from the declarations of the config's sections (each field's flag and the
modes that refuse it, :mod:`executor.train.config_sections`), so a flag has one place; the seed-style
flags come from :mod:`planner.seed_layout`. ``tests/train/test_flag_modes.py`` walks every flag of
the parser through every mode.
"""

from __future__ import annotations

import argparse
from dataclasses import Field, dataclass, field, fields, replace
from typing import Any

from executor.train.config import SECTIONS
from executor.train.config_option import MODES, opt_of
from executor.train.config_sections import VARLEN_ONLY, LayoutSection
from planner.errors import SpecError
from planner.plan import Plan

MODE_WORDS = {"plan": "a plan", "pool": "a strategy pool (--plan POOL.json, hot switching)",
              "elastic": "an elastic job", "elastic_pool": "an elastic job on a strategy pool"}
OPTION_FLAGS = {name: f"--{name}" for name in LayoutSection.PLAN_OPTIONS}  # PlanOptions field -> its flag
_SEED = "use either --plan or the seed-style flags"


@dataclass(frozen=True)
class Flag:
    """One flag: where its value lives and the modes that refuse it (mode -> what to do instead;
    ``elastic_pool`` follows from ``pool`` and ``elastic``, module docstring)."""

    flag: str
    attr: str | None  # the dotted TrainConfig field (run.steps); None: read by the CLI before the config
    refuse: dict[str, str] = field(default_factory=dict)
    seed: bool = False  # a seed-style layout flag: makes the plan without --plan, refused with it

    def __post_init__(self) -> None:
        elastic = self.refuse.get("elastic")
        why = self.refuse.get("pool") or (elastic if elastic != VARLEN_ONLY else None)
        if why is not None and "elastic_pool" not in self.refuse:
            self.refuse["elastic_pool"] = why


def _layout_rows(path: str, f: Field[Any], default: Any) -> dict[str, Flag]:
    """The rows of the flags that make a nested field (the seed layout at ``path``): each one names
    its field of it, but the CLI's own (the rendezvous fallbacks); refused with ``--plan``, but
    those every mode honours."""
    group = argparse.ArgumentParser(add_help=False).add_argument_group()
    f.metadata["cli"](group)
    names = {g.name for g in fields(default)}
    rows = {}
    for action in group._group_actions:
        attr = f"{path}.{action.dest}" if action.dest in names else None
        seed = attr is not None and action.dest not in f.metadata["every_mode"]
        rows[action.dest] = Flag(action.option_strings[0], attr, {m: _SEED for m in MODES} if seed else {}, seed=seed)
    return rows


def _rows() -> dict[str, Flag]:
    """argparse dest -> its row, from the sections' declarations (executor.train.config_sections)."""
    rows: dict[str, Flag] = {}
    for section, cls in SECTIONS.items():
        for f in fields(cls):
            o = opt_of(f)
            if o is not None:
                rows[o.dest] = Flag(o.flag, f"{section}.{f.name}", dict(o.refuse))
                if o.alternative is not None:  # read by the CLI only (--synthetic: no --data)
                    rows[o.alternative.dest] = Flag(o.alternative.flag, None)
            elif f.metadata.get("cli") is not None:
                rows.update(_layout_rows(f"{section}.{f.name}", f, getattr(cls(), f.name)))
    return rows


FLAGS: dict[str, Flag] = _rows()


def value_of(config: Any, dotted: str) -> Any:
    for name in dotted.split("."):
        config = getattr(config, name)
    return config


def _default_of(config: Any, dotted: str) -> Any:
    *head, last = dotted.split(".")
    owner = value_of(config, ".".join(head)) if head else config
    return next(f for f in fields(owner) if f.name == last).default


def given(config: Any, row: Flag) -> bool:
    """The flag was given (its value is not the config's default)."""
    return row.attr is not None and value_of(config, row.attr) != _default_of(config, row.attr)


def check_flags(config: Any, mode: str, *, seed_only: bool = False) -> None:
    """Refuse (``SpecError``, one line) the first given flag ``mode`` cannot honour (module
    docstring); ``seed_only``: the seed-style flags only (given with ``--plan``)."""
    for row in FLAGS.values():
        if row.seed and not config.layout.plan or seed_only and not row.seed:
            continue  # the seed-style flags are the layout here
        if mode in row.refuse and given(config, row):
            what = "given together with --plan" if row.seed else f"not available with {MODE_WORDS[mode]}"
            raise SpecError(row.flag, what, row.refuse[mode])


def apply_option_flags(plan: Plan, config: Any) -> tuple[Plan, str | None]:
    """``plan`` with the given plan-option flags in its options, checked as a plan's options are,
    and a line saying which options they replaced (None: nothing changed)."""
    new = {name: value_of(config.layout, name) for name in OPTION_FLAGS
           if given(config, FLAGS[name]) and value_of(config.layout, name) != getattr(plan.options, name)}
    if not new:
        return plan, None
    named = ", ".join(OPTION_FLAGS[n] for n in new)
    try:
        out = replace(plan, options=replace(plan.options, **new))  # checked as a loaded plan is (Plan.__post_init__)
    except SpecError as exc:
        raise SpecError(named, f"the plan's options with {'this flag' if len(new) == 1 else 'these flags'} are not "
                        f"valid: {exc}", "change the flag or the plan") from None
    changed = [f"options.{n} {getattr(plan.options, n)} -> {v}" for n, v in new.items()]
    return out, f"{named} replaced the plan's {', '.join(changed)}"

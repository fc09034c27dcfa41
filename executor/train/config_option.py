"""A train config field declared once: its flag, help, type, choices, range and the modes that
refuse it (no torch).

A section of :class:`executor.train.config.TrainConfig` declares each field as
``field(default=..., metadata=opt("--flag", help=..., ...))``. Everything else is derived from
those declarations: the ``hexiscale train`` parser (:mod:`hexiscale.cli.train_args`), the check
of each value (:func:`check_options`, from each section's ``__post_init__``: a bad value is one
``SpecError`` line naming the flag), and the table of flags per mode (:mod:`executor.train.flag_modes`).
A field without a flag says why (:func:`internal`); ``tests/train/test_config_sections.py``
checks that every field is one or the other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import Field, dataclass, field, fields
from typing import Any, ClassVar

from planner.errors import SpecError
from planner.ranges import check_int, check_number

MODES = ("plan", "pool", "elastic", "elastic_pool")  # what the training loop runs (executor.train.flag_modes)
Check = Callable[[str, Any], object]  # (flag, value): raises SpecError naming the flag


@dataclass(frozen=True)
class Opt:
    """How one field is typed on the command line, checked, and honoured per mode."""

    flag: str
    help: str | None = None
    type: Callable[[str], Any] | None = None  # argparse's type (None: a string, or a switch)
    choices: tuple[Any, ...] | None = None
    check: Check | None = None  # the range check of a value (None is not checked where it is the default)
    refuse: Mapping[str, str] = field(default_factory=dict)  # mode -> what to do instead
    group: str | None = None  # help group title; None: the section's GROUP
    metavar: str | None = None
    switch: bool = False  # a store_true flag
    path: bool = False  # its value names a file or folder (a launcher makes it absolute for its ranks)
    unset: bool = False  # argparse leaves it None (the CLI fills it in; --steps: else the seed's --run-iter)
    relaunch: bool = True  # train_argv repeats it (False: a launcher sets it itself: --plan, --device)
    alternative: Opt | None = None  # a CLI-only switch exclusive with this flag (--synthetic beside --data)

    def __post_init__(self) -> None:
        unknown = set(self.refuse) - set(MODES)
        if unknown:
            raise ValueError(f"{self.flag}: refuse names unknown modes {sorted(unknown)}")

    @property
    def dest(self) -> str:
        """argparse's name for it (``--stop-at`` -> ``stop_at``)."""
        return self.flag.lstrip("-").replace("-", "_")


def opt(flag: str, **kw: Any) -> dict[str, Any]:
    """A field's metadata: its flag (see :class:`Opt`)."""
    return {"opt": Opt(flag, **kw)}


def internal(why: str, *, cli: Callable[[Any], None] | None = None, build: Callable[[Any], Any] | None = None,
             every_mode: tuple[str, ...] = ()) -> dict[str, Any]:
    """A field's metadata without a flag of its own. The seed layout's: ``cli`` adds the flags that
    make it to an argparse group, ``build`` makes it from the parsed namespace; its flags make the
    layout without ``--plan`` and are refused with it, but those named in ``every_mode`` (dests)."""
    return {"internal": why, "cli": cli, "build": build, "every_mode": every_mode}


def opt_of(f: Field[Any]) -> Opt | None:
    return f.metadata.get("opt")


def options(section: Any) -> Iterator[tuple[Field[Any], Opt]]:
    """``(field, opt)`` of every field of a section class or instance that has a flag."""
    for f in fields(section):
        o = opt_of(f)
        if o is not None:
            yield f, o


def ints(low: int, high: int, hint: str = "") -> Check:
    return lambda flag, v: check_int(flag, v, low, high, hint)


def numbers(low: float | None = None, high: float | None = None, *, above: bool = False, unit: str = "",
            hint: str = "") -> Check:
    return lambda flag, v: check_number(flag, v, low, high, above=above, unit=unit, hint=hint)


def check_options(section: Any) -> None:
    """Check every flagged field of ``section`` against its choices and range, in field order."""
    for f, o in options(section):
        value = getattr(section, f.name)
        if value is None and f.default is None:
            continue  # not given: the default decides later
        if o.choices is not None and value not in o.choices:
            named = [str(c) for c in o.choices]
            raise SpecError(o.flag, f"{value!r} is not one of {', '.join(named)}", f"pass {o.flag} {named[0]}")
        if o.check is not None:
            o.check(o.flag, value)


class Section:
    """Base of a config section (a frozen dataclass): its flagged fields are checked on construction."""

    GROUP: ClassVar[str] = ""  # the help group of its flags

    def __post_init__(self) -> None:
        check_options(self)

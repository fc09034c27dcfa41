"""One name per meaning on the command line (issue 30): the output flag every file-writing command
shares, and old spellings that were renamed because one name meant two things.

A plain old spelling stays an extra option string of its flag (``estimate --save`` is
``-o/--output``; ``plan --global-batch`` is ``--global-batch-size``). A spelling whose name now
means something else elsewhere (``launch --trace``: the timing trace of ``train``) is a hidden
:class:`Renamed` flag: it still works, and :func:`renamed_notes` gives the line that says the new
name, which ``main`` prints after a run that worked (a user error stays one line).
``tests/foundation/test_flag_names.py`` walks every command's parser against its table of names.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

OUTPUT = ("-o", "--output")
GLOBAL_BATCH = "--global-batch-size"  # Megatron's name: samples per step, the total over every pipeline
_NOTES = "renamed_flags"  # namespace attribute holding the notes of renamed flags that were used
_TYPED = "typed_flags"  # namespace attribute: dest -> the spelling the command line used


def _record(namespace: argparse.Namespace, dest: str, option_string: str | None) -> None:
    if option_string:
        setattr(namespace, _TYPED, {**getattr(namespace, _TYPED, {}), dest: option_string})


def typed(args: argparse.Namespace, dest: str, new: str) -> str:
    """The spelling of flag ``dest`` that the command line used (``new`` if none): an error about
    its value names the flag as the user wrote it, old spelling or new."""
    return str(getattr(args, _TYPED, {}).get(dest, new))


class Spelled(argparse._StoreAction):
    """A flag with aliases that remembers which spelling was used (see :func:`typed`)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        super().__call__(parser, namespace, values, option_string)
        _record(namespace, self.dest, option_string)


def add_output(p: argparse.ArgumentParser | argparse._ArgumentGroup, help: str, *old: str,
               **kwargs: Any) -> argparse.Action:
    """``-o/--output`` (dest ``output``), with ``old`` spellings as aliases."""
    return p.add_argument(*OUTPUT, *old, dest="output", action=Spelled, help=help, **kwargs)


def add_global_batch(p: argparse.ArgumentParser, help: str) -> argparse.Action:
    """``--global-batch-size N`` (dest ``global_batch``; the old ``--global-batch`` an alias)."""
    return p.add_argument(GLOBAL_BATCH, "--global-batch", type=int, dest="global_batch", metavar="N",
                          action=Spelled, help=help)


class Renamed(argparse.Action):
    """An old spelling of a renamed flag: stores into the new flag's dest and records a note."""

    def __init__(self, option_strings: Sequence[str], dest: str, new: str = "", **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        _record(namespace, self.dest, option_string)
        notes = list(getattr(namespace, _NOTES, []))
        notes.append(f"{parser.prog} {option_string} is now {self.new} (the old name still works)")
        setattr(namespace, _NOTES, notes)


def add_renamed(p: argparse.ArgumentParser, old: str, new: argparse.Action) -> None:
    """``old`` as a hidden spelling of the flag ``new`` (same dest and value type)."""
    shape: dict[str, Any] = {"type": new.type} if new.type is not None else {}
    if new.choices is not None:
        shape["choices"] = new.choices
    p.add_argument(old, action=Renamed, new=new.option_strings[0], dest=new.dest, nargs=new.nargs,
                   default=argparse.SUPPRESS, help=argparse.SUPPRESS, **shape)


def renamed_notes(args: argparse.Namespace) -> list[str]:
    """One line per renamed flag that the command line used."""
    return list(getattr(args, _NOTES, []))

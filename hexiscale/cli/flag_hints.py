"""One line for an unknown flag, with the nearest known one (``--stepz`` -> ``did you mean --steps?``).

argparse answers an unknown flag with the whole usage text of the top-level parser and offers a
suggestion only from Python 3.14 (``suggest_on_error``); the CLI supports 3.10-3.13, so the
nearest flag is found here with :mod:`difflib`.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Sequence

from planner.errors import SpecError


def flags_of(parser: argparse.ArgumentParser) -> list[str]:
    """Every option string the parser shows (``--steps``, ``-o``, ...); hidden ones, old spellings
    of renamed flags, are left out: they are never suggested."""
    return [s for action in parser._actions if action.help != argparse.SUPPRESS for s in action.option_strings]


def nearest_flag(token: str, parser: argparse.ArgumentParser) -> str | None:
    """The shown flag closest to ``token`` (its ``=value`` part left out), if any is close."""
    name = token.partition("=")[0]
    close = difflib.get_close_matches(name, flags_of(parser), n=1, cutoff=0.6)
    return close[0] if close else None


def unknown_flags(argv: Sequence[str], parser: argparse.ArgumentParser) -> list[str]:
    """The arguments of ``argv`` that look like flags ``parser`` does not know (nor abbreviates),
    up to ``--``. For a usage error that argparse reports before its unknown flags (a required
    flag missing), so that the mistyped flag, likely the missing one, is named first. A value
    given to a flag (``--global-batch -inf``) is not a flag: argparse's own error names that flag."""
    takes_value = {s: action.nargs != 0 for action in parser._actions for s in action.option_strings}
    out = []
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        name = arg.partition("=")[0]
        if not arg.startswith("-") or arg == "-" or _NUMBER.match(arg) or name in takes_value:
            continue
        if i and takes_value.get(argv[i - 1], False):
            continue  # the previous flag's value
        if name.startswith("--") and any(f.startswith(name) for f in takes_value):
            continue  # an abbreviation argparse accepts
        out.append(arg)
    return out


_NUMBER = re.compile(r"^-[\d.]")  # a negative number (-1e+16 too): a value, whichever flag it was meant for


def unknown_arguments(extras: Sequence[str], parser: argparse.ArgumentParser,
                      argv: Sequence[str] = ()) -> SpecError:
    """The one-line error for arguments ``parser`` did not recognise (``argv``: the whole command
    line, to name the flag a stray value follows)."""
    flags = [e for e in extras if e.startswith("-") and e != "-"]
    if not flags:
        too_many = _one_value_too_many(extras[0], parser, argv)
        if too_many:
            return too_many
        return SpecError(parser.prog, f"unexpected argument {' '.join(extras)!r}", f"see '{parser.prog} --help'")
    first = flags[0].partition("=")[0]
    near = nearest_flag(first, parser)
    return SpecError(first, f"'{parser.prog}' has no such flag",
                     f"did you mean {near}?" if near else f"see '{parser.prog} --help'")


def _one_value_too_many(value: str, parser: argparse.ArgumentParser, argv: Sequence[str]) -> SpecError | None:
    """``value`` right after the value of a flag that takes one (``--global-batch-size 4 4``, a
    list where the flag means one number): the flag, and what it means."""
    takes_one = {s: a for a in parser._actions for s in a.option_strings if a.nargs is None}
    for i, arg in enumerate(argv):
        name, eq, _ = argv[i - 1].partition("=") if i else ("", "", "")
        flag = name if eq and name in takes_one else argv[i - 2] if i >= 2 and argv[i - 2] in takes_one else None
        if arg == value and flag:
            help = _help_text(takes_one[flag], parser)
            return SpecError(flag, f"takes one value, and {value!r} follows it",
                             f"{flag}: {help}" if help else f"see '{parser.prog} --help'")
    return None


def _help_text(action: argparse.Action, parser: argparse.ArgumentParser) -> str | None:
    """The flag's help as ``--help`` prints it (``%(default)s`` filled in); ``None`` if hidden."""
    if not action.help or action.help == argparse.SUPPRESS:
        return None
    try:
        return action.help % {**vars(action), "prog": parser.prog}
    except (KeyError, TypeError, ValueError):
        return action.help


class UsageError(Exception):
    """An argparse usage error raised instead of printing usage and exiting."""


class RaisingParser(argparse.ArgumentParser):
    """A parser whose usage errors raise :class:`UsageError` (for checking arguments of another command)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)

"""The ``hexiscale train`` arguments a launcher passes on (after ``launch ... --``), checked once in
the launcher before any rank starts, and with their paths made absolute.

Checked here, a mistyped flag or a bad value is one line (``--stepz: ... did you mean --steps?``)
instead of one usage text per rank; absolute paths let the ranks run from any folder on any node.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from executor.train.flag_modes import check_flags
from hexiscale.cli.flag_hints import RaisingParser, UsageError, unknown_arguments
from hexiscale.cli.train_args import add_train_arguments, path_dests, train_config
from planner.errors import SpecError

WHERE = "train arguments after --"
PATH_DESTS = path_dests()  # flags whose value is a path (declared with the config's fields)


def _train_parser() -> argparse.ArgumentParser:
    parser = RaisingParser(prog="hexiscale train", add_help=False)
    add_train_arguments(parser)
    return parser


def _action(parser: argparse.ArgumentParser, flag: str) -> argparse.Action | None:
    """The action ``flag`` selects, abbreviations included (as argparse matches them)."""
    known = parser._option_string_actions
    if flag in known:
        return known[flag]
    matches = {known[s] for s in known if s.startswith(flag) and s.startswith("--")}
    return matches.pop() if len(matches) == 1 else None


def _absolute(value: str) -> str:
    return value if value.startswith("synthetic:") else os.path.abspath(value)


def with_absolute_paths(argv: Sequence[str], parser: argparse.ArgumentParser) -> list[str]:
    out = list(argv)
    for i, token in enumerate(out):
        if not token.startswith("--"):
            continue
        flag, eq, value = token.partition("=")
        action = _action(parser, flag)
        if action is None or action.dest not in PATH_DESTS:
            continue
        if eq:
            out[i] = f"{flag}={_absolute(value)}"
        elif i + 1 < len(out):
            out[i + 1] = _absolute(out[i + 1])
    return out


def checked_train_args(train_args: Sequence[str], *, plan_path: str, mode: str = "plan") -> list[str]:
    """``train_args`` as every rank will parse them (a ``SpecError`` naming the flag if not, or a
    flag the ranks' ``mode`` refuses: :mod:`executor.train.flag_modes`), with absolute paths."""
    parser = _train_parser()
    try:
        ns, extras = parser.parse_known_args(["--plan", plan_path, *train_args])
    except UsageError as exc:
        raise SpecError(WHERE, str(exc), "see 'hexiscale train --help'") from None
    if extras:
        raise unknown_arguments(extras, parser, train_args)
    check_flags(train_config(ns), mode)  # every value checked, one line naming the flag
    return with_absolute_paths(train_args, parser)

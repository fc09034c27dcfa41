"""Entry point of the ``hexiscale`` console script.

Sub-commands are discovered from ``hexiscale/cli/cmd_*.py`` (each has ``register(subparsers)`` and
sets ``func`` on its parser). User errors (``SpecError``) print one line and exit 1; no traceback.
Commands that need torch (train, profile, launch, data) import the executor inside their handler, so
the command line starts without torch.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

from planner.errors import SpecError

EXIT_USER_ERROR = 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hexiscale",
        description="Plan, estimate and train Llama-style models on heterogeneous GPU clusters.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    import hexiscale.cli as pkg

    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if info.name.startswith("cmd_"):
            importlib.import_module(f"hexiscale.cli.{info.name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except SpecError as exc:
        from hexiscale.cli.output import print_error

        print_error(str(exc))
        return EXIT_USER_ERROR


if __name__ == "__main__":
    sys.exit(main())

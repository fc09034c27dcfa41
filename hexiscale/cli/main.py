"""Entry point of the ``hexiscale`` console script.

Sub-commands are discovered from ``hexiscale/cli/cmd_*.py`` (each has ``register(subparsers)`` and
sets ``func`` on its parser). User errors (``SpecError``) print one line and exit 1; no traceback
(a file that cannot be read or written is the same, as a safety net; Ctrl-C is 130).
Commands that need torch (train, profile, launch, data) import the executor inside their handler, so
the command line starts without torch.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import io
import os
import pkgutil
import sys
from collections.abc import Sequence

from planner.errors import SpecError

EXIT_USER_ERROR = 1
EXIT_INTERRUPTED = 130


@functools.cache
def build_parser() -> argparse.ArgumentParser:
    """The parser of every sub-command (built once per process: argparse keeps no state between
    ``parse_args`` calls, and in-process callers such as the fuzz suites call ``main`` many times)."""
    return _build_parser()


def _build_parser() -> argparse.ArgumentParser:
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


def unusable_argument(argv: Sequence[str]) -> str | None:
    """Why an argument can be no value of any flag, naming the flag; ``None`` when every argument is
    usable. Refused: an empty value, a NUL byte (no path or name may hold one), and ``--flag=--``
    (argparse turns that value into an empty list, which no command expects)."""
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if arg.startswith("-") and eq and value in ("", "--"):
            return f"the value of {flag} is {'empty' if value == '' else repr(value)}"
        if arg == "" or "\0" in arg:
            where = f"the value of {argv[i - 1]}" if i and argv[i - 1].startswith("-") else f"argument {i + 1}"
            return f"{where} is {'empty' if arg == '' else 'not text (it holds a NUL byte)'}"
    return None


def _command_parser(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.ArgumentParser:
    """The (sub-)sub-command parser that ``argv`` selects (``hexiscale data packing`` -> its parser)."""
    words = iter(argv)
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            return parser
        chosen = next((w for w in words if w in subs[0].choices), None)
        if chosen is None:
            return parser
        parser = subs[0].choices[chosen]


def unknown_in(parser: argparse.ArgumentParser, argv: Sequence[str], extras: Sequence[str]) -> SpecError:
    """The error for arguments that no flag of the selected command takes."""
    from hexiscale.cli.flag_hints import unknown_arguments

    return unknown_arguments(extras, _command_parser(parser, argv), argv)


def _parse(parser: argparse.ArgumentParser,
           argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]] | SpecError:
    """``parse_known_args``, except that an unknown flag wins over argparse's other usage errors
    (a missing required flag printed the usage text, hiding the nearest-flag hint for the
    mistyped one): that error then comes back as the one-line hint."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            return parser.parse_known_args(argv)
    except SystemExit as exc:
        if exc.code == 2:
            from hexiscale.cli.flag_hints import unknown_flags

            chosen = _command_parser(parser, argv)
            unknown = unknown_flags(argv, chosen)
            if unknown:
                return unknown_in(parser, argv, unknown)
        sys.stderr.write(captured.getvalue())
        raise


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    problem = unusable_argument(argv)
    if problem:
        parser.error(problem)  # exit 2, as for any other usage error
    from hexiscale.cli.output import print_error

    parsed = _parse(parser, argv)
    if isinstance(parsed, SpecError):
        print_error(str(parsed))
        return 2
    args, extras = parsed

    if extras:  # one line naming the nearest flag, not the top-level usage text
        print_error(str(unknown_in(parser, argv, extras)))
        return 2
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        code = int(args.func(args) or 0)
    except SpecError as exc:
        print_error(str(exc))
        return EXIT_USER_ERROR
    except BrokenPipeError:  # the reader went away (``| head``): nothing more to say
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - Python flushes stdout at exit
        return EXIT_USER_ERROR
    except OSError as exc:  # a safety net: files are read and written through checked helpers
        print_error(f"{exc.filename or 'file'}: {exc.strerror or exc} (hint: check the path)")
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    if code == 0:  # after a run that worked: a user error stays one line
        from hexiscale.cli.flag_names import renamed_notes
        from hexiscale.cli.output import print_note

        for note in renamed_notes(args):
            print_note(note)
    return code


if __name__ == "__main__":
    sys.exit(main())

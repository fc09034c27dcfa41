"""Run the ``hexiscale`` command line in-process for the fuzz suites, with the checks every case
shares: it ends within a time bound (a hang is a failure), raises nothing (a traceback is a
failure), exits 0, 1 or 2, and a user error (1) is exactly one ``error: FIELD: ...`` line (a
training rank prefixes it with its place, ``[rank 0 (host h)] error: ...``)."""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass

from hexiscale.cli.main import main
from tests.support.deadline import deadline

# a case takes milliseconds; the bound only turns a hang into a failure, so it leaves room for a
# machine under heavy load (nothing here may be flaky)
CASE_TIMEOUT_S = 60.0
# ``error: ...``, or from a training rank ``[rank 0 (host h, node n)] error: ...``
ERROR_LINE = re.compile(r"(\[rank \d+ \([^\]]*\)\] )?error: ")


@dataclass(frozen=True)
class Outcome:
    code: int
    out: str
    err: str

    @property
    def error(self) -> str:
        """The one error line (exit code 1), or argparse's last line (exit code 2)."""
        lines = self.err.strip().splitlines()
        return lines[-1] if lines else ""


def run_cli(argv: Sequence[str], timeout_s: float = CASE_TIMEOUT_S) -> Outcome:
    out, err = io.StringIO(), io.StringIO()
    code: int
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), deadline(timeout_s, " ".join(argv)):
            code = main(list(argv))
    except SystemExit as exc:  # argparse: usage errors (2), --help (0)
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:
        raise AssertionError(f"hexiscale {' '.join(map(repr, argv))} raised {type(exc).__name__}: {exc}") from exc
    result = Outcome(code, out.getvalue(), err.getvalue())
    assert code in (0, 1, 2), (argv, code, result.err)
    if code == 1:
        text = result.err.strip()
        assert ERROR_LINE.match(text) and "\n" not in text, (argv, text)
        assert "Traceback" not in text
    if code == 2:
        assert "error:" in result.error, (argv, result.err)
    return result


def names(outcome: Outcome, field: str) -> bool:
    """Whether the failed run's message names ``field`` (the flag or the field path)."""
    return outcome.code in (1, 2) and field in outcome.error

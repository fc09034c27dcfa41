"""Writing the files a run appends to as it goes (``--log-jsonl``, ``--trace``): a failure is one
line naming the flag and the file, and a full disk says so (a bare ``OSError: [Errno 28]`` named
neither). Nothing here touches checkpoints: those already written stay as they are."""

from __future__ import annotations

import errno
from pathlib import Path

from planner.errors import SpecError


def output_error(path: str | Path, flag: str, exc: OSError, *, training: bool = True) -> SpecError:
    """One line for a failed write of ``path`` (given by ``flag``); ``training``: a run's output, whose
    checkpoints the hint says are kept (a command's ``-o`` has none)."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        kept = "; the checkpoints written so far are kept (continue with --resume)" if training else ""
        return SpecError(flag, f"cannot write {path}: the disk is full ({exc.strerror or 'no space left'})",
                         f"free space on that disk or point {flag} at another one{kept}")
    return SpecError(flag, f"cannot write {path}: {exc.strerror or exc}", "pass a path you may write to")


def write_text(path: str | Path, text: str, flag: str, *, append: bool = False) -> None:
    """Write (or append) ``text`` to ``path``; an ``OSError`` becomes one ``SpecError`` line."""
    try:
        with open(path, "a" if append else "w") as f:
            f.write(text)
    except OSError as exc:
        raise output_error(path, flag, exc) from None

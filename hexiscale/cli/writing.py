"""Files a command was asked to write (``-o``, ``--save``, ``--out``): a path that cannot be written
is one error line naming the flag, found before any long work where possible."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from planner.errors import SpecError


@contextmanager
def writing(flag: str, path: str | Path) -> Iterator[None]:
    """Turn an ``OSError`` raised inside into a ``SpecError`` naming ``flag`` and ``path``."""
    try:
        yield
    except OSError as exc:
        raise SpecError(flag, f"cannot write {path}: {exc.strerror or type(exc).__name__}",
                        "pass a path in a folder you may write to") from None


def check_writable(path: str | Path, flag: str, *, folder: bool = False) -> None:
    """``path`` can be written as a file (``folder``: created as a folder); nothing is created."""
    p = Path(path)
    if p.exists() and p.is_dir() != folder:
        raise SpecError(flag, f"{path} is {'not a folder' if folder else 'a folder'}",
                        f"pass a {'folder' if folder else 'file'} path")
    parent = p.absolute().parent
    while folder and not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise SpecError(flag, f"{path}: folder {parent} does not exist", "create it or pass another path")
    if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise SpecError(flag, f"{path} is not writable", "pass a path you may write to")

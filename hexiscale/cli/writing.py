"""Files a command was asked to write (``-o``): a path that cannot be written
is one error line naming the flag, found before any long work where possible. A FIFO that nobody
reads is refused (opening it to write would block forever); ``/dev/null`` or a pipe that is read
(``-o /dev/stdout | jq``) is fine."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from executor.train.output_files import output_error
from planner.errors import SpecError


@contextmanager
def writing(flag: str, *paths: str | Path, folder: bool = False) -> Iterator[None]:
    """Check ``paths`` (see :func:`check_writable`), then turn an ``OSError`` raised inside into a
    ``SpecError`` naming ``flag`` and the first path."""
    for path in paths:
        check_writable(path, flag, folder=folder)
    try:
        yield
    except OSError as exc:  # a full disk says so, as the training outputs do
        raise output_error(paths[0], flag, exc, training=False) from None


def check_writable(path: str | Path, flag: str, *, folder: bool = False) -> None:
    """``path`` can be written as a file (``folder``: created as a folder); nothing is created."""
    p = Path(path)
    if p.exists() and p.is_dir() != folder:
        raise SpecError(flag, f"{path} is {'not a folder' if folder else 'a folder'}",
                        f"pass a {'folder' if folder else 'file'} path")
    if p.exists() and stat.S_ISFIFO(p.stat().st_mode):
        _check_pipe_is_read(p, flag)
    parent = p.absolute().parent
    while folder and not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise SpecError(flag, f"{path}: folder {parent} does not exist", "create it or pass another path")
    if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise SpecError(flag, f"{path} is not writable", "pass a path you may write to")


def _check_pipe_is_read(path: Path, flag: str) -> None:
    """A named pipe with no reader would block the write forever: refuse it at once."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise SpecError(flag, f"{path} is a named pipe that nobody reads", "pass a file path") from None
        raise

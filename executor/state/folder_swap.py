"""Writing a folder that replaces another without ever deleting what we did not write.

A command that writes a folder (a checkpoint, an exported model) writes it under a fresh sibling
that only it created (:func:`fresh_sibling`), then swaps it in (:func:`swap_in`):

* the target does not exist: the sibling is renamed to it;
* the target exists: the caller has checked it is an earlier one of ours (``is_ours``); the two
  folders exchange names in one step (Linux ``renameat2(RENAME_EXCHANGE)``; elsewhere two renames
  that put the old folder back if the second fails), and only then is the old one, now under the
  sibling's name, deleted. Until the swap the old folder is untouched, so a failure or a kill before
  it loses nothing; a folder that is not ours is refused with one line and never touched.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from planner.errors import SpecError

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def fresh_sibling(path: Path) -> Path:
    """A new, empty folder next to ``path`` (a unique hidden name: nobody else's folder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))


def check_replaceable(path: Path, is_ours: Callable[[Path], bool], flag: str, what: str) -> None:
    """``path`` is absent, an empty folder, or ``is_ours``; else one ``SpecError`` line."""
    if not path.exists() and not path.is_symlink():
        return
    if path.is_dir() and not path.is_symlink() and (not any(path.iterdir()) or is_ours(path)):
        return
    raise SpecError(flag, f"{path} exists and is not {what}; nothing was written",
                    "pass a new folder (an earlier one of ours is replaced, anything else is never touched)")


def _exchange(a: Path, b: Path) -> bool:
    """Swap the names of ``a`` and ``b`` atomically; False where the system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    done = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    return bool(done == 0)


def swap_in(new: Path, path: Path, is_ours: Callable[[Path], bool], flag: str, what: str) -> None:
    """Make the folder ``new`` (from :func:`fresh_sibling`) be ``path`` (module docstring)."""
    check_replaceable(path, is_ours, flag, what)
    if not path.exists():
        os.replace(new, path)
        return
    if _exchange(new, path):
        shutil.rmtree(new)  # the old folder, now under the sibling's name
        return
    old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
    os.replace(path, old)  # onto the empty folder we just made
    try:
        os.replace(new, path)
    except OSError:
        os.replace(old, path)
        raise
    shutil.rmtree(old)

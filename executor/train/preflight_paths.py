"""Pre-flight: the folders and files a run will write are writable before the first step.

A wrong ``--checkpoint-dir`` or ``--log-jsonl`` used to fail at the first save or log line, after
training had started (or, for checkpoints, hours later). Each is checked on the ranks that write
it: the path is not something else (a file where a folder goes, a folder where a file goes), and
the nearest existing folder on its way is writable (folders are created when the run writes).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from planner.errors import SpecError


def _nearest_existing(path: Path) -> Path:
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _writable_folder(folder: Path, flag: str, shown: str) -> None:
    if not folder.is_dir():
        raise SpecError(flag, f"{shown}: {folder} is not a folder", f"pass a path under a folder for {flag}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise SpecError(flag, f"{shown}: folder {folder} is not writable", "pass a path you may write to")
    try:  # access() says yes to root and on some mounts (/proc, /sys, root-squashed NFS) where writing fails
        fd, probe = tempfile.mkstemp(prefix=".hexiscale-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise SpecError(flag, f"{shown}: cannot create a file in {folder}: {exc.strerror or exc}",
                        "pass a path you may write to") from None


def check_output_dir(path: str, flag: str) -> None:
    """``path`` is a writable folder, or can be created as one."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise SpecError(flag, f"{path} exists and is not a folder", "pass a folder")
    _writable_folder(_nearest_existing(p), flag, path)


def check_output_file(path: str, flag: str) -> None:
    """``path`` is a file this rank can append to (its folder must exist): opened once, now."""
    p = Path(path)
    if p.is_dir():
        raise SpecError(flag, f"{path} is a folder", "pass a file name")
    if not p.parent.absolute().is_dir():
        raise SpecError(flag, f"{path}: folder {p.parent} does not exist", "create it or pass another path")
    try:
        with open(p, "a"):
            pass
    except OSError as exc:
        raise SpecError(flag, f"cannot write {path}: {exc.strerror}", "pass a path you may write to") from None

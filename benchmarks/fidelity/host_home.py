"""A calibration home (``hexiscale calibrate``'s ``devices/`` and ``calibration/`` JSON files) as one
JSON object, ``{"devices/<key>.json": ..., "calibration/<key>.json": ...}``: what a fidelity run
keeps of its host (``host4`` embeds it; ``repredict`` writes it back to estimate the run again)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

KINDS = ("devices", "calibration")


def read_home(folder: Path) -> dict[str, Any]:
    """``{"devices/<key>.json": ..., "calibration/<key>.json": ...}`` of a calibration home."""
    return {f"{kind}/{f.name}": json.loads(f.read_text()) for kind in KINDS
            for f in sorted((folder / kind).glob("*.json"))}


def write_home(files: dict[str, Any], folder: Path) -> Path:
    for rel, data in files.items():
        kind, _, name = rel.partition("/")
        if kind not in KINDS or not name.endswith(".json") or "/" in name:
            raise SystemExit(f"host home: entry {rel!r} is not devices/<key>.json or calibration/<key>.json")
        (folder / kind).mkdir(parents=True, exist_ok=True)
        (folder / kind / name).write_text(json.dumps(data))
    return folder


@contextmanager
def installed(files: dict[str, Any]) -> Iterator[Path]:
    """``files`` written to a temporary folder that is ``HEXISCALE_HOME`` (and the planner's catalog
    read afresh) while the block runs; the caller's home and catalog after."""
    from planner.catalog import _cached

    before = os.environ.get("HEXISCALE_HOME")
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_home(files, Path(tmp))
        os.environ["HEXISCALE_HOME"] = str(folder)
        _cached.cache_clear()
        try:
            yield folder
        finally:
            _cached.cache_clear()
            if before is None:
                os.environ.pop("HEXISCALE_HOME", None)
            else:
                os.environ["HEXISCALE_HOME"] = before

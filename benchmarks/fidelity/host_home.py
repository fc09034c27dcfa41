"""A calibration home (``hexiscale calibrate``'s ``devices/`` and ``calibration/`` JSON files) as one
JSON object, ``{"devices/<key>.json": ..., "calibration/<key>.json": ...}``: what a fidelity run
keeps of its host (``host4`` embeds it; ``repredict`` writes it back to estimate the run again)."""

from __future__ import annotations

import json
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

"""Damage to a written checkpoint that only its values can reveal (shared by the checkpoint tests)."""

from __future__ import annotations

import io
import json
import zlib
from pathlib import Path

import torch


def nan_item_with_valid_checksum(ck: Path, file: str) -> None:
    """Overwrite the first stored tensor of ``file`` with NaN (same length) and record the new
    bytes' checksum in ``meta.json``: what a checkpoint saved from a diverged run looks like."""
    meta = json.loads((ck / "meta.json").read_text())
    off, (length, _) = min(meta["checksums"][file].items(), key=lambda kv: int(kv[0]))
    with open(ck / file, "r+b") as f:
        f.seek(int(off))
        value = torch.load(io.BytesIO(f.read(length)), weights_only=True)
        buf = io.BytesIO()
        torch.save(torch.full_like(value, float("nan")), buf)
        assert len(buf.getvalue()) == length, "a NaN tensor of the same shape serialises to the same length"
        f.seek(int(off))
        f.write(buf.getvalue())
    meta["checksums"][file][off] = [length, zlib.crc32(buf.getvalue())]
    (ck / "meta.json").write_text(json.dumps(meta))

"""A profile file resumes only rows timed alike (:class:`executor.profiler.store.ProfileFile`): host-free
rows (``"device_times": "full-queue"``, executor/profiler/timing.py) are never added to a file of rows
timed before, whose ``forward_s`` held the host's issue rate where a pass was launch-bound."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from executor.profiler.store import MEASURED_FORMAT, ProfileFile
from planner.errors import SpecError


def _entry(meta: dict[str, object]) -> dict[str, object]:
    return {"key": "x", "measured": {"format": MEASURED_FORMAT, "meta": {"sm_percent": None, **meta},
                                     "model": {"name": "m"}, "dtype": "bf16", "layer": []}}


def test_host_free_rows_do_not_resume_a_file_timed_before(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(_entry({})))
    with pytest.raises(SpecError, match="timing method"):
        ProfileFile.open(path, _entry({"device_times": "full-queue"}))
    assert ProfileFile.open(path, _entry({})).measured["meta"] == {"sm_percent": None}  # alike: resumed

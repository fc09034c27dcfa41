"""A recorded host calibration (benchmarks/results/calibrations/) installed as a hexiscale home, so
a GPU run is priced as its run priced it."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from planner.catalog import _cached

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


@contextmanager
def calibration_home(stem: str | dict[str, str], home: Path, key: str = "h100-sxm-measured") -> Iterator[Path]:
    """``HEXISCALE_HOME`` = ``home`` holding the calibration ``stem`` (``.json`` and ``.device.json``)
    as ``key`` — or each ``{key: stem}`` of several (a run priced with an MPS share's entry beside the
    whole GPU's) — for the duration; the catalog cache cleared on entry and exit."""
    stems = stem if isinstance(stem, dict) else {key: stem}
    for suffix, sub in ((".json", "calibration"), (".device.json", "devices")):
        (home / sub).mkdir(parents=True)
        for k, st in stems.items():
            shutil.copy(RESULTS / "calibrations" / f"{st}{suffix}", home / sub / f"{k}.json")
    mp = pytest.MonkeyPatch()
    mp.setenv("HEXISCALE_HOME", str(home))
    _cached.cache_clear()
    try:
        yield home
    finally:
        mp.undo()
        _cached.cache_clear()

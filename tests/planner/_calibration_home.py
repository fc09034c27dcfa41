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
def calibration_home(stem: str, home: Path, key: str = "h100-sxm-measured") -> Iterator[Path]:
    """``HEXISCALE_HOME`` = ``home`` holding the calibration ``stem`` (``.json`` and ``.device.json``)
    as ``key``, for the duration; the catalog cache cleared on entry and exit."""
    for suffix, sub in ((".json", "calibration"), (".device.json", "devices")):
        (home / sub).mkdir(parents=True)
        shutil.copy(RESULTS / "calibrations" / f"{stem}{suffix}", home / sub / f"{key}.json")
    mp = pytest.MonkeyPatch()
    mp.setenv("HEXISCALE_HOME", str(home))
    _cached.cache_clear()
    try:
        yield home
    finally:
        mp.undo()
        _cached.cache_clear()

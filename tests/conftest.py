"""Every test sees an empty host calibration home (``HEXISCALE_HOME``), never the developer's
``~/.hexiscale``: plans and estimates must not depend on what the machine running the suite
has calibrated. Tests that calibrate point ``HEXISCALE_HOME`` at their own folder; a program run
in-process that points it elsewhere (``long_context --calibration``) is undone after its test, so
the next test on that worker does not price with its calibration."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest

from tests.support.slow_first import slow_modules_first

os.environ["HEXISCALE_HOME"] = tempfile.mkdtemp(prefix="hexiscale-home-")
EMPTY_HOME = os.environ["HEXISCALE_HOME"]


@pytest.fixture(autouse=True)
def _empty_calibration_home() -> Iterator[None]:
    yield
    os.environ["HEXISCALE_HOME"] = EMPTY_HOME


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules with multi-process tests run first (:mod:`tests.support.slow_first` says why)."""
    items[:] = slow_modules_first(items)

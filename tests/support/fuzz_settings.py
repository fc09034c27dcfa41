"""Hypothesis settings of the fuzz suites (tests/fuzz).

In CI every suite runs a fixed, derandomized set of cases (the same cases on every run and every
machine, no example database, no deadline: nothing depends on load). ``HEXISCALE_FUZZ_SCALE=N``
multiplies every suite's case count and draws fresh random cases, for a long run by hand::

    HEXISCALE_FUZZ_SCALE=20 .venv/bin/python -m pytest -n 2 tests/fuzz
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

SCALE = float(os.environ.get("HEXISCALE_FUZZ_SCALE", "1") or 1)


def fuzz(max_examples: int) -> settings:
    """Settings for one fuzz test of ``max_examples`` cases in CI (times ``HEXISCALE_FUZZ_SCALE``)."""
    return settings(max_examples=max(1, round(max_examples * SCALE)), deadline=None, derandomize=SCALE == 1,
                    database=None, suppress_health_check=list(HealthCheck))

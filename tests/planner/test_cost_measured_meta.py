"""A measured entry whose ``meta`` is not a mapping is one error naming the field, not an
``AttributeError`` (found by tests/fuzz/test_fuzz_profile_files.py: ``"meta": "x"``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.catalog import default_catalog
from planner.cost.measured import MeasuredProfile
from planner.errors import SpecError


@pytest.mark.parametrize("meta", ["x", [1], 3])
def test_meta_not_a_mapping_is_one_spec_error(meta: object) -> None:
    entry = default_catalog().get("h100-sxm-measured")
    bad = replace(entry, measured={**(entry.measured or {}), "meta": meta})
    with pytest.raises(SpecError, match=r"devices.h100-sxm-measured.measured.meta: expected a mapping"):
        MeasuredProfile(bad)
    MeasuredProfile(replace(entry, measured={**(entry.measured or {}), "meta": None}))  # absent: fine

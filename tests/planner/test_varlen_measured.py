"""The measured length histograms ship as package data (``planner/varlen/data/``) and load by name."""

from __future__ import annotations

import pytest

from planner.errors import SpecError
from planner.varlen.measured import measured_histogram, measured_names


def test_every_shipped_histogram_loads_at_the_context_its_name_says() -> None:
    names = measured_names()
    assert {"code-16k", "code-32k", "web-16k", "web-32k"} <= set(names)
    for name in names:
        hist = measured_histogram(name)
        assert hist.context == int(name.rsplit("-", 1)[1].rstrip("k")) * 1024
        assert hist.sequences > 0


def test_an_unknown_name_is_one_line_naming_the_ones_there_are() -> None:
    with pytest.raises(SpecError, match=r"^lengths: no measured histogram 'code-8k' .*code-16k") as e:
        measured_histogram("code-8k")
    assert "\n" not in str(e.value)

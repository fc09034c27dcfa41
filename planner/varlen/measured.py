"""The length histograms measured on corpora (``benchmarks.planner.length_distributions``): the
CPython standard library (``code``) and Wikipedia articles (``web``), plus the synthetic presets'
histograms, each at 16K and 32K contexts (``code-32k``, ...). They ship as package data under
``planner/varlen/data/`` and are read through :mod:`importlib.resources`, so a non-editable install
finds them as the repository does."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from planner.errors import SpecError
from planner.varlen.histogram import LengthHistogram, load_histogram


def measured_dir() -> Path:
    """The folder of the shipped histograms (``<name>.json``, ``hexiscale.lengths/1``)."""
    return Path(str(resources.files("planner.varlen") / "data"))


def measured_names() -> list[str]:
    return sorted(p.stem for p in measured_dir().glob("*.json"))


def measured_histogram(name: str) -> LengthHistogram:
    """The shipped histogram ``name`` (e.g. ``code-32k``); an unknown name is a :class:`SpecError`
    naming the ones there are."""
    path = measured_dir() / f"{name}.json"
    if not path.is_file():
        raise SpecError("lengths", f"no measured histogram {name!r}",
                        f"use one of {', '.join(measured_names())}")
    return load_histogram(path)

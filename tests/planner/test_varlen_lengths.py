"""Length histograms (hexiscale.lengths/1) and the synthetic long-tailed generator."""

from __future__ import annotations

import json

import numpy as np
import pytest

from planner.errors import SpecError
from planner.varlen.histogram import (
    LengthHistogram,
    chunk_lengths,
    default_edges,
    draw_step,
    histogram_from_dict,
    load_histogram,
)
from planner.varlen.synthetic import PRESETS, LongTail, preset


def test_documents_are_cut_to_the_context() -> None:
    assert chunk_lengths([40000, 5, 16384, 0], 16384) == [16384, 16384, 7232, 5, 16384]
    with pytest.raises(SpecError, match="context"):
        chunk_lengths([3], 0)


def test_histogram_counts_statistics_and_round_trip(tmp_path) -> None:
    h = LengthHistogram.from_lengths([1, 2, 3, 8, 9, 100, 5000, 40000], "t", context=16384, source="unit")
    assert h.sequences == 10 and h.edges[:-2] == default_edges(16384)[: len(h.edges) - 2]
    assert h.edges[-2:] == (16384, 16385) and h.counts[-1] == 2  # the full-context chunks: a bin of their own
    assert h.fraction_below(8) == pytest.approx(3 / 10)
    assert h.fraction_below(16384) == pytest.approx(8 / 10)
    assert 0 < h.token_fraction_below(8) < h.fraction_below(8)
    assert h.quantile(1.0) >= 16384 and h.quantile(0.3) <= 8
    h.save(tmp_path / "h.json")
    assert load_histogram(tmp_path / "h.json") == h
    draws = h.sample(2000, np.random.Generator(np.random.PCG64(0)))
    assert min(draws) >= 1 and max(draws) <= 16384
    assert sum(d < 8 for d in draws) / 2000 == pytest.approx(3 / 10, abs=0.04)
    assert sum(d == 16384 for d in draws) / 2000 == pytest.approx(2 / 10, abs=0.04)


def test_draw_step_fills_the_token_budget() -> None:
    h = PRESETS["commoncrawl"].histogram(16384, 5000)
    rng = np.random.Generator(np.random.PCG64(1))
    for _ in range(20):
        s = draw_step(h, 65536, rng)
        assert sum(s) <= 65536 or len(s) == 1
        assert max(s) <= 16384


@pytest.mark.parametrize("bad, match", [
    ({"format": "x", "edges": [1, 2], "counts": [1]}, "format"),
    ({"format": "hexiscale.lengths/1", "edges": [1, 2, 3], "counts": [1]}, "one count per bin"),
    ({"format": "hexiscale.lengths/1", "edges": [2, 1], "counts": [1]}, "increasing"),
    ({"format": "hexiscale.lengths/1", "edges": [1, 2], "counts": [0]}, "at least one"),
    ({"format": "hexiscale.lengths/1", "edges": [1, 2], "counts": [1.5]}, r"counts\[0\]"),
    ({"format": "hexiscale.lengths/1", "edges": [1, 2], "counts": [1], "extra": 1}, "extra"),
    ({"format": "hexiscale.lengths/1", "edges": [1, 2], "counts": [1], "context": 0}, "context"),
])
def test_bad_histograms_are_spec_errors(bad: dict, match: str, tmp_path) -> None:
    with pytest.raises(SpecError, match=match):
        histogram_from_dict(bad)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(bad))
    with pytest.raises(SpecError) as err:
        load_histogram(p)
    assert str(p) in str(err.value)


def test_commoncrawl_preset_matches_the_published_figure() -> None:
    """About 97 % of CommonCrawl sequences are under 8K at a 32K context."""
    h = PRESETS["commoncrawl"].histogram(32768, 50_000)
    assert h.fraction_below(8192) == pytest.approx(0.97, abs=0.005)
    assert h.context == 32768 and h.quantile(1.0) == 32768
    # at 16K more documents are cut, and the share under 8K is still ~97 %
    assert PRESETS["commoncrawl"].histogram(16384, 50_000).fraction_below(8192) == pytest.approx(0.97, abs=0.01)
    assert PRESETS["github"].histogram(32768, 50_000).fraction_below(8192) < 0.9


def test_long_tail_validation() -> None:
    with pytest.raises(SpecError, match="share"):
        LongTail("x", 100, 0.4, 1000, 4096)
    with pytest.raises(SpecError, match="median"):
        LongTail("x", 5000, 0.9, 1000, 4096)
    with pytest.raises(SpecError, match="unknown length preset"):
        preset("books")

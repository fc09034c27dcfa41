"""The varlen/packed path priced from its own measurements (issue 32): ``hexiscale calibrate`` records a
layer's time on packed rows (``measured.packed``); :func:`planner.calibration.packed.packed_fit` fits
``a·Σs² + b·Σs + c + d·n`` to them and :func:`planner.varlen.seq_cost.stage_cost` prices the stage's layers
from that fit where the GPU type has it, instead of the full-length rows' figures (which left packed
steps under-predicted 1.4-2.1x)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from benchmarks.fidelity.host4 import cluster_for
from planner.calibration.packed import packed_fit, packed_rows, row_totals
from planner.catalog import Catalog, default_catalog
from planner.cost import ProfileSet
from planner.errors import SpecError
from planner.model import model_from_dict
from planner.plan import Pipeline, Stage
from planner.varlen.seq_cost import fit_points, fit_points_cost, stage_cost

KEY = "h100-sxm-measured"


def with_packed(section: dict[str, Any]) -> Catalog:
    entries = default_catalog().entries
    entry = next(e for e in entries if e.key == KEY)
    return Catalog([*(e for e in entries if e.key != KEY), replace(entry, measured={**entry.measured,
                                                                                    "packed": section})])


def rows_from(layer: Any, factor: float, model: Any) -> list[dict[str, Any]]:
    """Packed rows as a host ``factor`` times slower per token than the profile would time them: the
    profile's own layer cost ``a·Σs² + b·Σs + c`` (fitted over its micro-batches past the launch
    floor), the ``s``-terms scaled by ``factor``, summed over the row's documents, ``c`` paid once per row."""
    points = fit_points(model.seq_len)
    own = fit_points_cost(points, [layer(m, s) for m, s in points])
    out = []
    for lengths in packed_rows(model.seq_len, row_totals(model.seq_len)):
        t = factor * sum(own.sequence_s(s) for s in lengths) + own.c
        out.append({"lengths": lengths, "forward_s": t / 3, "backward_s": 2 * t / 3})
    return out


def test_stage_cost_follows_the_measured_packed_layer() -> None:
    base = ProfileSet(default_catalog())
    prof = base.get(KEY)
    model = model_from_dict(prof.device.measured["model"])
    dtype = prof.device.measured["dtype"]

    def layer(m: int, s: int) -> float:
        return prof.layer_time(model, m, 1, dtype, "none", s).total_s

    section = {"tp": 1, "recompute": "none", "rows": rows_from(layer, 3.0, model)}
    fit = packed_fit(ProfileSet(with_packed(section)).get(KEY), model, dtype)
    assert fit is not None and fit.rows == len(section["rows"])
    assert fit.fit_error < 0.1  # the rows follow a·Σs² + b·Σs + c + d·n closely
    for r in section["rows"]:
        assert fit.seconds(r["lengths"]) == pytest.approx(r["forward_s"] + r["backward_s"], rel=fit.fit_error + 1e-9)
    cluster = cluster_for((100,) * 4, KEY, cpu=False)
    pipe = Pipeline(8, 8, (Stage(("g0:0",), 1, (0, model.num_layers // 2)),
                           Stage(("g1:0",), 1, (model.num_layers // 2, model.num_layers))))
    kw: dict[str, Any] = {"context": model.seq_len, "dtype": dtype, "recompute": "none"}
    plain = stage_cost(model, cluster, pipe, 1, profiles=base, **kw)
    measured = stage_cost(model, cluster, pipe, 1, profiles=ProfileSet(with_packed(section)), **kw)
    assert measured.packed_measured and not plain.packed_measured
    layers = model.num_layers // 2
    for s in (model.seq_len // 8, model.seq_len // 2, model.seq_len):  # micro-batches of 2 contexts
        m = 2 * model.seq_len // s
        want = plain.micro_batch_s([s] * m) + layers * (fit.seconds([s] * m) - layer(m, s))
        assert measured.micro_batch_s([s] * m) == pytest.approx(want, rel=plain.fit_error + measured.fit_error)
    many = [model.seq_len // 8] * 16
    assert measured.micro_batch_s(many) > 1.5 * plain.micro_batch_s(many)  # a slower host


def test_no_fit_for_another_layer_shape_or_dtype_and_bad_rows_named() -> None:
    prof = ProfileSet(default_catalog()).get(KEY)
    model = model_from_dict(prof.device.measured["model"])
    dtype = prof.device.measured["dtype"]
    rows = [{"lengths": [model.seq_len // k] * k, "forward_s": 1e-3 * k, "backward_s": 2e-3 * k} for k in (1, 2, 4)]
    entry = ProfileSet(with_packed({"tp": 1, "rows": rows})).get(KEY)
    assert packed_fit(entry, model, dtype) is not None
    assert packed_fit(entry, replace(model, hidden_size=model.hidden_size * 2), dtype) is None
    assert packed_fit(entry, model, "fp32" if dtype != "fp32" else "bf16") is None
    assert packed_fit(prof, model, dtype) is None  # the packaged entry has no packed rows
    bad = ProfileSet(with_packed({"tp": 1, "rows": [{"lengths": [0], "forward_s": 1.0, "backward_s": 1.0}]})).get(KEY)
    with pytest.raises(SpecError, match=r"measured\.packed\.rows\[0\]\.lengths"):
        packed_fit(bad, model, dtype)

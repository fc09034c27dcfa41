"""The packed (varlen) layer cost measured on this host: ``t = a·Σs² + b·Σs + c`` seconds per layer
and packed row, fitted to the rows ``hexiscale calibrate`` times (``measured.packed`` of a device
entry, :mod:`executor.profiler.packed`: one layer of the profiled model, TP 1, no recompute, rows of
documents of mixed length under the executor's packed attention).

:mod:`planner.varlen.seq_cost` prices a stage's layers from it where the GPU type has it and the
plan's model has the profiled layer's shape (other TP degrees and recompute modes carried by the
roofline's ratio), instead of the full-length rows' figures: packed rows were under-predicted
1.4-2.1x that way (issue 32). The fit is non-negative least squares on relative errors."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.catalog import DeviceType
from planner.errors import SpecError
from planner.model import ModelSpec, model_from_dict

SHAPE = ("hidden_size", "ffn_hidden_size", "num_heads", "num_kv_heads")
SPLITS = (1, 2, 4, 8)  # documents per row, each row holding the same tokens


def packed_rows(seq_len: int, rows_tokens: tuple[int, ...]) -> list[list[int]]:
    """Document lengths per row: each total ``T`` of ``rows_tokens`` cut into documents of
    ``seq_len / k`` tokens for ``k`` in :data:`SPLITS` (the same tokens, ``Σs²`` falling with ``k``;
    the totals set ``Σs``), the last one taking the remainder."""
    out: list[list[int]] = []
    for total in rows_tokens:
        for k in SPLITS:
            size = seq_len // k
            if size < 1:
                continue
            lengths = [size] * (total // size) + ([total % size] if total % size else [])
            if lengths not in out:
                out.append(lengths)
    return out


@dataclass(frozen=True)
class PackedFit:
    """``a·Σs² + b·Σs + c`` seconds; ``fit_error``: the worst relative error over its rows."""

    a: float
    b: float
    c: float
    fit_error: float
    rows: int

    def seconds(self, lengths: Sequence[int]) -> float:
        return self.a * sum(x * x for x in lengths) + self.b * sum(lengths) + self.c


def fit_abc(squares: Sequence[float], sums: Sequence[float], seconds: Sequence[float]) -> tuple[float, float, float,
                                                                                               float]:
    """Non-negative ``(a, b, c)`` of ``t = a·squares + b·sums + c`` minimising the relative squared
    error; with the worst relative error."""
    from scipy.optimize import nnls  # imported here: scipy.optimize costs every rank process ~0.4 s

    q, s, t = (np.asarray(x, float) for x in (squares, sums, seconds))
    rows = np.stack([q, s, np.ones_like(s)], axis=1) / t[:, None]
    scale = rows.max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(rows / scale, np.ones_like(s))
    a, b, c = (float(x) for x in coef / scale)
    err = float(np.max(np.abs((a * q + b * s + c) / t - 1.0)))
    return a, b, c, err


def _rows(section: Any, path: str) -> list[tuple[list[int], float]]:
    if not isinstance(section, Mapping) or not isinstance(section.get("rows"), list):
        raise SpecError(path, "expected {\"tp\": 1, \"rows\": [...]}", "re-run 'hexiscale calibrate'")
    out = []
    for i, r in enumerate(section["rows"]):
        p = f"{path}.rows[{i}]"
        lengths = r.get("lengths") if isinstance(r, Mapping) else None
        if not isinstance(lengths, list) or not lengths or any(
                isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in lengths):
            raise SpecError(f"{p}.lengths", "needs a list of positive document lengths", "re-run 'hexiscale calibrate'")
        t = [r.get(k) for k in ("forward_s", "backward_s")]
        if any(isinstance(x, bool) or not isinstance(x, int | float) or not 0 < x < math.inf for x in t):
            raise SpecError(p, "needs positive forward_s and backward_s", "re-run 'hexiscale calibrate'")
        out.append((lengths, float(t[0]) + float(t[1])))
    return out


def packed_fit(device: DeviceType, model: ModelSpec, dtype: str) -> PackedFit | None:
    """The fit of ``device``'s packed rows for ``model``'s layer in ``dtype``; None where the entry has
    none, was measured in another dtype or on another layer shape, or has too few rows (3)."""
    m = device.measured or {}
    section = m.get("packed")
    if section is None or m.get("dtype") != dtype:
        return None
    path = f"devices.{device.key}.measured.packed"
    rows = _rows(section, path)
    measured = model_from_dict(m.get("model"), f"devices.{device.key}.measured.model")
    if any(getattr(measured, k) != getattr(model, k) for k in SHAPE) or len(rows) < 3:
        return None
    a, b, c, err = fit_abc([sum(x * x for x in ls) for ls, _ in rows], [sum(ls) for ls, _ in rows],
                           [t for _, t in rows])
    return PackedFit(a, b, c, err, len(rows))

"""The packed (varlen) layer cost measured on this host, per layer and packed row of documents ``s_d``::

    t = a·Σs_d² + b·Σs_d + c + d·n          n = the row's documents

fitted to the rows ``hexiscale calibrate`` times (``measured.packed`` of a device entry,
:mod:`executor.profiler.packed`: one layer of the profiled model, TP 1, no recompute, rows of
documents of mixed length under the executor's packed attention).

Why ``d``, a cost per document: the executor runs a packed row's attention per document
(:func:`executor.data.packed_docs.packed_attention`: causal SDPA on each document's slice, one
launch each, where no varlen kernel is available; else one varlen kernel whose grid is cut into
per-document tiles; the calibration records which, ``measured.packed.kernel``), so at the same
tokens a row of many short documents is SLOWER, not faster as ``a·Σs²`` alone says. On 4x H100
(2026-11-27, llama-1.3b, 2K and 4K-token rows) every table shows it: at 4K tokens 16 documents of
256 cost 0.5-1.3 ms per layer more than 2 of 2048, and the fit finds 107-113 µs a document in all
three tables; ``a·Σs² + b·Σs + c`` (NNLS sets ``a = 0``: it cannot bend upward) missed its own rows
by 20-34 % held out (this form: 18-27 %; tests/planner/test_packed_fit_recorded.py).

``a`` is attention's score and value work, quadratic in each document: the executor's attention
kernel priced by the profile's roofline (:func:`attention_per_square`), not fitted — at 2-8K tokens
it is a few % of a row, below the rows' noise (fitted, NNLS put it at 0-1e-10 and the held-out
error was no better). ``b``, ``c`` and ``d`` are non-negative least squares on relative errors;
``held_out`` is the leave-one-out error over the rows (each row predicted by the fit of the others).

:mod:`planner.varlen.seq_cost` prices a stage's layers from it where the GPU type has it and the
plan's model has the profiled layer's shape (other TP degrees and recompute modes carried by the
roofline's ratio), instead of the full-length rows' figures: packed rows were under-predicted
1.4-2.1x that way (issue 32). Calibrations written before ``d`` existed keep their rows, and the fit
is made from the rows when they load, so they are priced with ``d`` too.

``hexiscale calibrate`` gates the fit on its mean leave-one-out error (:func:`packed_gate`, the limit
of ``--max-held-out-error``): a fit above it keeps its rows in the entry, marked :data:`LEFT_OUT` with
the reason, and :func:`packed_fit` then answers None, so the packed path is priced as on a GPU type
without packed rows (the full-length table's figures); ``--force`` installs it."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.cost.pass_times import host_free, pass_seconds
from planner.cost.profile import DeviceProfile
from planner.errors import SpecError
from planner.model import ModelSpec, model_from_dict

SHAPE = ("hidden_size", "ffn_hidden_size", "num_heads", "num_kv_heads")
SPLITS = (1, 2, 4, 8)  # documents of seq_len / k tokens, each row holding the same tokens
LEFT_OUT = "left_out"  # measured.packed: why calibrate left the rows' terms out (then they price nothing)
MIN_ROW_TOKENS = 4096  # 2K-token rows of llama-1.3b on H100 were launch-bound: 2.7-4.6 ms for the same row


def row_totals(seq_len: int, min_tokens: int = MIN_ROW_TOKENS) -> tuple[int, int]:
    """Token totals of calibrate's packed rows: at least ``min_tokens``, so on a GPU a row's time is
    the GPU's (the host's launch floor, noisy from run to run, hid the per-token and per-document
    terms in 2K-token rows: the same row took 2.7 ms in one calibration and 4.6 ms in the next,
    while their 4K-token rows agreed within 2-7 %), and twice that, so ``b`` is told apart from
    ``c`` and ``d``."""
    base = max(seq_len, min_tokens)
    return base, 2 * base


def packed_rows(seq_len: int, rows_tokens: tuple[int, ...]) -> list[list[int]]:
    """Document lengths per row: each total ``T`` of ``rows_tokens`` cut into documents of
    ``seq_len / k`` tokens for ``k`` in :data:`SPLITS` (the same tokens, ``Σs²`` falling and the
    documents rising with ``k``; the totals set ``Σs``), the last one taking the remainder."""
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
    """``a·Σs² + b·Σs + c + d·n`` seconds per layer and row; ``fit_error``: the worst relative error
    over its rows; ``held_out`` / ``held_out_mean``: the worst / mean leave-one-out error (0 with
    fewer than 4 rows)."""

    a: float
    b: float
    c: float
    fit_error: float
    rows: int
    d: float = 0.0
    held_out: float = 0.0
    held_out_mean: float = 0.0

    def seconds(self, lengths: Sequence[int]) -> float:
        return self.a * sum(x * x for x in lengths) + self.b * sum(lengths) + self.c + self.d * len(lengths)


def fit_terms(columns: Sequence[Sequence[float]], seconds: Sequence[float],
              fixed: Sequence[float] | None = None) -> tuple[list[float], float]:
    """Non-negative coefficients ``k`` of ``t = fixed + Σ_i k_i·columns[i]`` minimising the relative
    squared error; with the worst relative error."""
    from scipy.optimize import nnls  # imported here: scipy.optimize costs every rank process ~0.4 s

    t = np.asarray(seconds, float)
    f = np.zeros_like(t) if fixed is None else np.asarray(fixed, float)
    rows = np.stack([np.asarray(c, float) for c in columns], axis=1) / t[:, None]
    scale = np.abs(rows).max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(rows / scale, 1.0 - f / t)
    k = coef / scale
    err = float(np.max(np.abs((rows @ k) + f / t - 1.0)))
    return [float(x) for x in k], err


def fit_packed(rows: Sequence[Sequence[int]], seconds: Sequence[float], attention_a: float) -> PackedFit:
    """The module's fit of ``seconds[i]`` (one layer on the row of documents ``rows[i]``), ``a`` fixed at
    ``attention_a`` (:func:`attention_per_square`), with its leave-one-out error."""

    def one(idx: Sequence[int]) -> tuple[list[float], float]:
        cols = [[float(sum(rows[i])) for i in idx], [1.0] * len(idx), [float(len(rows[i])) for i in idx]]
        fixed = [attention_a * sum(x * x for x in rows[i]) for i in idx]
        return fit_terms(cols, [seconds[i] for i in idx], fixed)

    (b, c, d), err = one(range(len(rows)))
    held = []
    if len(rows) >= 4:
        for i in range(len(rows)):
            (bi, ci, di), _ = one([j for j in range(len(rows)) if j != i])
            held.append(abs(PackedFit(attention_a, bi, ci, 0.0, 0, di).seconds(rows[i]) / seconds[i] - 1.0))
    return PackedFit(attention_a, b, c, err, len(rows), d, max(held, default=0.0),
                     sum(held) / len(held) if held else 0.0)


def packed_gate(fit: PackedFit, max_mean: float) -> str | None:
    """Why ``fit`` must not price packed steps silently: its mean leave-one-out error is above
    ``max_mean`` (None when it may)."""
    if fit.held_out_mean <= max_mean:
        return None
    return (f"the packed (varlen) fit predicts rows it was not fitted to with {fit.held_out_mean * 100:.1f} % mean "
            f"error (worst {fit.held_out * 100:.1f} %, leave-one-out over {fit.rows} rows), above the "
            f"{max_mean * 100:g} % limit")


def attention_per_square(profile: DeviceProfile, model: ModelSpec, dtype: str) -> float:
    """Seconds per ``s²`` of one layer's attention core, forward and backward, at TP 1 (the profile's
    roofline at the model's ``seq_len``): the ``a`` of :class:`PackedFit`."""
    fwd, bwd = profile.attention_core_time(model, 1, 1, dtype, "none", model.seq_len)
    return (fwd + bwd) / model.seq_len ** 2


def _rows(section: Any, path: str, full_queue: bool) -> list[tuple[list[int], float]]:
    """``(lengths, seconds)`` per row: a layer's forward and backward, each its pass time
    (:func:`planner.cost.pass_times.pass_seconds`: ``max(device, host)`` of host-free rows)."""
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
        out.append((lengths, pass_seconds(r, "forward_s", full_queue) + pass_seconds(r, "backward_s", full_queue)))
    return out


def packed_fit(profile: DeviceProfile, model: ModelSpec, dtype: str) -> PackedFit | None:
    """The fit of the packed rows of ``profile``'s GPU type for ``model``'s layer in ``dtype`` (``a`` from
    the profile's roofline: :func:`attention_per_square`); None where the entry has none, was measured
    in another dtype or on another layer shape, has too few rows (3: ``b``, ``c``, ``d``), or was left out
    by calibrate's gate (:data:`LEFT_OUT`)."""
    device = profile.device
    m = device.measured or {}
    section = m.get("packed")
    if section is None or m.get("dtype") != dtype or (isinstance(section, Mapping) and section.get(LEFT_OUT)):
        return None
    path = f"devices.{device.key}.measured.packed"
    rows = _rows(section, path, host_free(m))
    measured = model_from_dict(m.get("model"), f"devices.{device.key}.measured.model")
    if any(getattr(measured, k) != getattr(model, k) for k in SHAPE) or len(rows) < 3:
        return None
    return fit_packed([ls for ls, _ in rows], [t for _, t in rows], attention_per_square(profile, model, dtype))

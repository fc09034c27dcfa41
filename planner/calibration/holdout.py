"""Held-out error of the compute fit: how well the fitted roofline predicts timings it was not fitted to.

The in-sample error of :func:`planner.calibration.fit.fit_compute` flatters the fit: eight terms fitted
to a few dozen timings can bend to them and still price a new shape badly. Here the fit is
cross-validated over its own timings: the measured points (a layer shape; its forward and backward
times together, since they share the shape, and for host-free rows their host times too, each
predicted on the fit's own basis: device by the roofline's GPU time, host by its host time) are
dealt round-robin into ``folds`` folds; for each fold the terms are fitted, from the same start, to
the other folds' timings and predict the fold's. The mean and worst ``|predicted / measured - 1|``
over every held-out timing is the figure ``hexiscale calibrate`` gates on (:func:`gate`) and records
in the calibration file (``fits.compute.held_out``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from planner.calibration.fit import compute_bounds, fit_terms, layer_observations, predict_compute
from planner.catalog import DeviceType
from planner.cost.params import CostParams

DEFAULT_FOLDS = 5
DEFAULT_MAX_MEAN = 0.10  # mean held-out |error| above this is not installed without --force


@dataclass(frozen=True)
class HeldOut:
    mean_abs_rel: float
    max_abs_rel: float
    folds: int
    observations: int

    def to_dict(self) -> dict[str, Any]:
        return {"mean_abs_rel": self.mean_abs_rel, "max_abs_rel": self.max_abs_rel, "folds": self.folds,
                "observations": self.observations, "method": "k-fold over measured points"}


def held_out_compute(device: DeviceType, base: CostParams, folds: int = DEFAULT_FOLDS) -> HeldOut:
    """Cross-validate the compute fit of ``device`` from ``base`` (module docstring)."""
    obs = layer_observations(device)
    dtype = str((device.measured or {}).get("dtype", "bf16"))
    bounds = compute_bounds(device)
    points: dict[int, int] = {}  # id of the measured row -> its point index (both phases share it)
    point_of = [points.setdefault(id(row), len(points)) for _, _, row, _, _ in obs]
    k = min(folds, len(points))
    if k < 2:
        raise ValueError(f"{len(points)} measured point(s): cross-validation needs at least 2")
    errors: list[float] = []
    for fold in range(k):
        train = [o for o, p in zip(obs, point_of) if p % k != fold]
        test = [o for o, p in zip(obs, point_of) if p % k == fold]
        fit = fit_terms(base, bounds, partial(predict_compute, device, obs=train, dtype=dtype), [o[4] for o in train])
        pred = predict_compute(device, fit.params, test, dtype)
        errors.extend(abs(p / o[4] - 1.0) for p, o in zip(pred, test))
    err = np.asarray(errors)
    return HeldOut(float(err.mean()), float(err.max()), k, len(errors))


def gate(held: HeldOut, max_mean: float) -> str | None:
    """Why a fit with this held-out error must not be installed silently (None when it may)."""
    if held.mean_abs_rel <= max_mean:
        return None
    return (f"the compute fit predicts timings it was not fitted to with {held.mean_abs_rel * 100:.1f} % mean error "
            f"(worst {held.max_abs_rel * 100:.1f} %, {held.folds}-fold over {held.observations} timings), above "
            f"the {max_mean * 100:g} % limit")

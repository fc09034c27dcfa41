"""A device profile from measured tables, interpolated by a ratio to the roofline.

The profiler (``hexiscale profile``) measures the executor's own layer on a grid of
``(micro_batch, seq_len, tp, recompute)`` points. A query at an arbitrary point is answered as::

    time(q) = roofline(q) · r(q)

``roofline`` is :class:`planner.cost.SpecProfile` (this entry's peaks, the set's ``CostParams``), and
``r`` the measured-to-roofline ratio, which varies slowly: at a measured point ``r`` is the exact ratio
(so the table is reproduced), elsewhere it is the inverse-square-distance average of the measured
ratios in ``(log micro_batch, log seq_len)`` over the rows with the query's TP degree (the nearest
measured degree in ``log2`` otherwise) and recompute mode (else the ``none`` rows; the recompute extra
then comes from the roofline scaled by the forward ratio). Embedding and head tables work the same way.
The optimizer step is fitted as ``a·tensors + b·params`` (non-negative least squares) from its table.

Tables only apply to the model shape they were measured with (hidden, ffn, heads, kv-heads, vocab) and
dtype; any other query falls back to the roofline alone.
"""

from __future__ import annotations

import math
from typing import Any

from planner.catalog import Catalog, DeviceType
from planner.cost.params import DEFAULT_PARAMS, CostParams
from planner.cost.profile import DeviceProfile, PassTime, ProfileSet, SpecProfile
from planner.errors import SpecError
from planner.model import ModelSpec

MEASURED_FORMAT = "hexiscale.measured/1"
SHAPE_KEYS = ("hidden_size", "ffn_hidden_size", "num_heads", "num_kv_heads", "vocab_size")


def has_tables(device: DeviceType) -> bool:
    m = device.measured
    return bool(m) and m.get("format") == MEASURED_FORMAT and bool(m.get("layer"))  # type: ignore[union-attr]


class MeasuredProfile(DeviceProfile):
    """Measured tables of one device type (``derived: measured``), roofline-ratio interpolated."""

    source = "measured"

    def __init__(self, device: DeviceType, params: CostParams = DEFAULT_PARAMS):
        super().__init__(device, params)
        m: dict[str, Any] = device.measured or {}
        if m.get("format") != MEASURED_FORMAT:
            raise SpecError(f"devices.{device.key}.measured.format", f"expected {MEASURED_FORMAT!r}, got "
                            f"{m.get('format')!r}", "re-run 'hexiscale profile'")
        self.table_model: dict[str, Any] = dict(m.get("model") or {})
        self.dtype = str(m.get("dtype", "bf16"))
        self.tables: dict[str, list[dict[str, Any]]] = {t: list(m.get(t) or []) for t in ("layer", "embedding", "head")}
        self.spec = SpecProfile(device, params)
        self._opt = _fit_optimizer(list(m.get("optimizer") or []))

    # ------------------------------------------------------------------ helpers
    def applies(self, model: ModelSpec, dtype: str) -> bool:
        return dtype == self.dtype and all(self.table_model.get(k) == getattr(model, k) for k in SHAPE_KEYS)

    def _table_model(self, model: ModelSpec, seq_len: int) -> ModelSpec:
        from dataclasses import replace

        return replace(model, seq_len=max(model.seq_len, seq_len))

    def _ratio(self, table: str, model: ModelSpec, micro_batch: int, seq_len: int, tp: int, dtype: str,
               recompute: str | None) -> tuple[float, float] | None:
        rows = self.tables[table]
        if recompute is not None:
            same = [r for r in rows if r.get("recompute") == recompute]
            rows = same or [r for r in rows if r.get("recompute") == "none"]
        if not rows:
            return None
        tps = sorted({int(r["tp"]) for r in rows})
        best_tp = min(tps, key=lambda t: (abs(math.log2(t) - math.log2(tp)), t))
        rows = [r for r in rows if int(r["tp"]) == best_tp]
        num_f = num_b = den = 0.0
        for r in rows:
            spec = self._spec(table, model, int(r["micro_batch"]), int(r["seq_len"]), best_tp, dtype,
                              str(r.get("recompute", "none")))
            rf, rb = r["forward_s"] / spec.forward_s, r["backward_s"] / spec.backward_s
            d = abs(math.log(r["micro_batch"] / micro_batch)) + abs(math.log(r["seq_len"] / seq_len))
            if d < 1e-9:
                return rf, rb
            w = 1.0 / (d * d)
            num_f += w * rf
            num_b += w * rb
            den += w
        return num_f / den, num_b / den

    def _spec(self, table: str, model: ModelSpec, micro_batch: int, seq_len: int, tp: int, dtype: str,
              recompute: str) -> PassTime:
        mm = self._table_model(model, seq_len)
        if table == "layer":
            return self.spec.layer_time(mm, micro_batch, tp, dtype, recompute, seq_len)
        if table == "embedding":
            return self.spec.embedding_time(mm, micro_batch, tp, dtype, seq_len)
        return self.spec.head_time(mm, micro_batch, tp, dtype, seq_len)

    def _scaled(self, table: str, model: ModelSpec, micro_batch: int, tp: int, dtype: str, recompute: str | None,
                seq_len: int) -> PassTime:
        spec = self._spec(table, model, micro_batch, seq_len, tp, dtype, recompute or "none")
        ratio = self._ratio(table, model, micro_batch, seq_len, tp, dtype, recompute) \
            if self.applies(model, dtype) else None
        if ratio is None:
            return spec
        return PassTime(spec.forward_s * ratio[0], spec.backward_s * ratio[1])

    # ------------------------------------------------------------------ DeviceProfile hooks
    def _layer(self, model: ModelSpec, micro_batch: int, tp: int, dtype: str, recompute: str,
               seq_len: int) -> PassTime:
        return self._scaled("layer", model, micro_batch, tp, dtype, recompute, seq_len)

    def _embedding(self, model: ModelSpec, micro_batch: int, tp: int, dtype: str, seq_len: int) -> PassTime:
        return self._scaled("embedding", model, micro_batch, tp, dtype, None, seq_len)

    def _head(self, model: ModelSpec, micro_batch: int, tp: int, dtype: str, seq_len: int) -> PassTime:
        return self._scaled("head", model, micro_batch, tp, dtype, None, seq_len)

    def optimizer_time(self, num_params: float, num_tensors: int, dtype: str = "bf16") -> float:
        if self._opt is None:
            return self.spec.optimizer_time(num_params, num_tensors, dtype)
        per_tensor, per_param = self._opt
        return per_tensor * num_tensors + per_param * num_params


def _fit_optimizer(rows: list[dict[str, Any]]) -> tuple[float, float] | None:
    """``seconds = a·num_tensors + b·num_params`` by non-negative least squares (relative error)."""
    if not rows:
        return None
    if len(rows) == 1:
        r = rows[0]
        return 0.0, r["seconds"] / r["num_params"]
    import numpy as np
    from scipy.optimize import nnls

    a = np.array([[r["num_tensors"] / r["seconds"], r["num_params"] / r["seconds"]] for r in rows])
    sol, _ = nnls(a, np.ones(len(rows)))
    if sol[1] <= 0:
        return 0.0, sum(r["seconds"] for r in rows) / sum(r["num_params"] for r in rows)
    return float(sol[0]), float(sol[1])


class MeasuredProfileSet(ProfileSet):
    """A ``ProfileSet`` whose measured catalog entries (``hexiscale.measured/1`` tables) get a
    :class:`MeasuredProfile`; every other entry the spec roofline."""

    def __init__(self, catalog: Catalog | None = None, params: CostParams = DEFAULT_PARAMS,
                 prefer_measured: bool = True):
        super().__init__(catalog, params, prefer_measured)

    def get(self, gpu: str) -> DeviceProfile:
        prof = self._profiles.get(gpu)
        if prof is None:
            device = self.catalog.get(gpu)
            prof = MeasuredProfile(device, self.params) if self.prefer_measured and has_tables(device) \
                else SpecProfile(device, self.params)
            self._profiles[gpu] = self._profiles[device.key] = prof
        return prof

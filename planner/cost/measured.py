"""Measured compute profiles: tables from the profiler, read from a catalog entry's ``measured``
section, interpolated, with the spec roofline filling the gaps.

Format (``hexiscale.measured/1``; the profiler writes it, times in milliseconds, recompute none)::

    "measured": {
      "format": "hexiscale.measured/1",
      "dtype": "bf16",                       # the compute dtype the tables were taken in
      "provenance": {...},                   # free-form: GPU name, driver, torch, date, SM %
      "layer": [                             # one transformer layer, one TP shard
        {"model": {"hidden_size": 4096, "ffn_hidden_size": 11008, "num_heads": 32, "num_kv_heads": 32},
         "tp": 1, "seq_len": 4096,
         "points": [[1, 10.2, 21.9], [2, 19.8, 42.5], [4, 39.1, 84.0]]}   # [micro_batch, fwd_ms, bwd_ms]
      ],
      "embedding": [ ...same, "model" adds "vocab_size"... ],
      "head":      [ ...same, "model" adds "vocab_size"... ],   # final norm + LM head + loss
      "optimizer": {"bytes_per_s": 2.1e12}   # optional: measured AdamW streaming rate
    }

Lookup of (model, micro_batch, tp, dtype, seq_len):

1. Entries of the same kind whose ``model`` fields equal the model's, in the same dtype. None:
   the spec roofline (the profile reports itself measured only for what it has).
2. An entry with the same ``tp`` and ``seq_len``: piecewise-linear interpolation over
   ``micro_batch`` inside the measured range.
3. Otherwise, and outside the range: the nearest measured point (same tp first, then nearest
   seq_len, then nearest micro-batch) times the spec roofline's ratio between the requested and
   the measured configuration. The roofline carries the *shape* of the curve; the table its level.

Recompute adds to the measured backward what it repeats: ``full`` the measured forward,
``selective`` the spec attention-core time scaled by measured/spec forward of the same point.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from planner.catalog import DeviceType
from planner.cost.ops import DTYPE_BYTES, attention_core_forward
from planner.cost.params import DEFAULT_PARAMS, CostParams
from planner.cost.profile import DeviceProfile, PassTime
from planner.errors import SpecError
from planner.model import ModelSpec

MEASURED_FORMAT = "hexiscale.measured/1"
KINDS = ("layer", "embedding", "head")
SHAPE_KEYS = {"layer": ("hidden_size", "ffn_hidden_size", "num_heads", "num_kv_heads"),
              "embedding": ("hidden_size", "vocab_size"), "head": ("hidden_size", "vocab_size")}


@dataclass(frozen=True)
class Table:
    shape: tuple[tuple[str, int], ...]
    tp: int
    seq_len: int
    mbs: tuple[int, ...]
    fwd: tuple[float, ...]  # seconds
    bwd: tuple[float, ...]


def parse_measured(data: Mapping[str, Any], path: str) -> tuple[str, dict[str, list[Table]], float | None]:
    """Validate a ``measured`` section; returns (dtype, tables per kind, optimizer bytes/s)."""
    if data.get("format") != MEASURED_FORMAT:
        raise SpecError(f"{path}.format", f"expected {MEASURED_FORMAT!r}, got {data.get('format')!r}",
                        "re-run the profiler")
    dtype = data.get("dtype")
    if dtype not in DTYPE_BYTES:
        raise SpecError(f"{path}.dtype", f"{dtype!r} is not bf16, fp16 or fp32", "record the compute dtype")
    tables: dict[str, list[Table]] = {k: [] for k in KINDS}
    for kind in KINDS:
        entries = data.get(kind, [])
        if not isinstance(entries, list):
            raise SpecError(f"{path}.{kind}", "expected a list", "write a list of tables")
        for i, ent in enumerate(entries):
            p = f"{path}.{kind}[{i}]"
            if not isinstance(ent, Mapping) or not {"model", "tp", "seq_len", "points"} <= set(ent):
                raise SpecError(p, "needs model, tp, seq_len and points", "see planner/cost/measured.py")
            model = ent["model"]
            if not isinstance(model, Mapping) or any(not isinstance(model.get(k), int) for k in SHAPE_KEYS[kind]):
                raise SpecError(f"{p}.model", f"needs integer {', '.join(SHAPE_KEYS[kind])}", "record the model shape")
            points = sorted(ent["points"], key=lambda r: r[0]) if isinstance(ent["points"], list) else None
            ok = points and all(isinstance(r, list) and len(r) == 3 and isinstance(r[0], int) and r[0] >= 1
                                and all(isinstance(x, int | float) and x > 0 for x in r[1:]) for r in points)
            if not ok or len({r[0] for r in points or []}) != len(points or []):
                raise SpecError(f"{p}.points", "expected [[micro_batch, forward_ms, backward_ms], ...] with "
                                "distinct positive micro-batches and positive times", "fix the table")
            assert points is not None
            tables[kind].append(Table(tuple((k, int(model[k])) for k in SHAPE_KEYS[kind]), int(ent["tp"]),
                                      int(ent["seq_len"]), tuple(r[0] for r in points),
                                      tuple(r[1] * 1e-3 for r in points), tuple(r[2] * 1e-3 for r in points)))
    opt = data.get("optimizer", {}) or {}
    rate = opt.get("bytes_per_s") if isinstance(opt, Mapping) else None
    if rate is not None and (not isinstance(rate, int | float) or rate <= 0):
        raise SpecError(f"{path}.optimizer.bytes_per_s", "must be a positive number", "fix the value")
    return str(dtype), tables, float(rate) if rate is not None else None


def _interp(xs: tuple[int, ...], ys: tuple[float, ...], x: float) -> float:
    i = bisect.bisect_left(xs, x)
    if i < len(xs) and xs[i] == x:
        return ys[i]
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


class MeasuredProfile(DeviceProfile):
    """Measured tables (see the module docstring) over the spec roofline."""

    source = "measured"

    def __init__(self, device: DeviceType, params: CostParams = DEFAULT_PARAMS):
        super().__init__(device, params)
        self.dtype, self.tables, self.optimizer_rate = parse_measured(device.measured or {},
                                                                      f"devices.{device.key}.measured")

    def _lookup(self, kind: str, model: ModelSpec, mb: int, tp: int, dtype: str, seq_len: int,
                spec: Any) -> PassTime | None:
        """Measured (fwd, bwd) for the configuration, or None where no table matches."""
        if dtype != self.dtype:
            return None
        shape = tuple((k, getattr(model, k)) for k in SHAPE_KEYS[kind])
        cands = [t for t in self.tables[kind] if t.shape == shape]
        if not cands:
            return None
        for t in cands:
            if t.tp == tp and t.seq_len == seq_len and t.mbs[0] <= mb <= t.mbs[-1]:
                return PassTime(_interp(t.mbs, t.fwd, mb), _interp(t.mbs, t.bwd, mb))
        t = min(cands, key=lambda c: (c.tp != tp, abs(math.log(c.seq_len / seq_len)), abs(math.log(c.tp / tp))))
        j = min(range(len(t.mbs)), key=lambda i: abs(math.log(t.mbs[i] / mb)))
        want: PassTime = spec(model, mb, tp, dtype, seq_len)
        have: PassTime = spec(model, t.mbs[j], t.tp, dtype, t.seq_len)
        return PassTime(t.fwd[j] * want.forward_s / have.forward_s, t.bwd[j] * want.backward_s / have.backward_s)

    def _layer(self, model: ModelSpec, micro_batch: int, tp: int, dtype: str, recompute: str,
               seq_len: int) -> PassTime:
        def spec(m: ModelSpec, b: int, t: int, d: str, s: int) -> PassTime:
            return self._spec_layer(m, b, t, d, "none", s)

        got = self._lookup("layer", model, micro_batch, tp, dtype, seq_len, spec)
        if got is None:
            return self._spec_layer(model, micro_batch, tp, dtype, recompute, seq_len)
        extra = 0.0
        if recompute == "full":
            extra = got.forward_s
        elif recompute == "selective":
            base = spec(model, micro_batch, tp, dtype, seq_len).forward_s
            attn = self.op_time(attention_core_forward(model, micro_batch, seq_len, tp, DTYPE_BYTES[dtype]), dtype)
            extra = attn * got.forward_s / base
        return PassTime(got.forward_s, got.backward_s + extra)

    def _embedding(self, model: ModelSpec, micro_batch: int, tp: int, dtype: str, seq_len: int) -> PassTime:
        got = self._lookup("embedding", model, micro_batch, tp, dtype, seq_len, self._spec_embedding)
        return got if got is not None else self._spec_embedding(model, micro_batch, tp, dtype, seq_len)

    def _head(self, model: ModelSpec, micro_batch: int, tp: int, dtype: str, seq_len: int) -> PassTime:
        got = self._lookup("head", model, micro_batch, tp, dtype, seq_len, self._spec_head)
        return got if got is not None else self._spec_head(model, micro_batch, tp, dtype, seq_len)

    def optimizer_time(self, num_params: float, num_tensors: int, dtype: str = "bf16") -> float:
        if self.optimizer_rate is None:
            return super().optimizer_time(num_params, num_tensors, dtype)
        from planner.cost.ops import optimizer_bytes_per_param

        return num_tensors * self.params.kernel_overhead_s + num_params * optimizer_bytes_per_param(dtype) / \
            self.optimizer_rate

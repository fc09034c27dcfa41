"""Measured compute profiles: the profiler's tables (``hexiscale profile``, executor/profiler/store.py),
read from a catalog entry's ``measured`` section, interpolated, with the spec roofline filling gaps.

The layout (``hexiscale.measured/1``, written by the profiler; times in seconds)::

    "measured": {
      "format": "hexiscale.measured/1", "meta": {...}, "dtype": "bf16",
      "model": {ModelSpec fields},            # the model whose shapes were timed
      "layer":     [{"micro_batch", "seq_len", "tp", "recompute", "forward_s", "backward_s",
                     "activation_bytes"?, "peak_bytes"?, "collectives"?}, ...],
      "embedding": [{"micro_batch", "seq_len", "tp", "forward_s", "backward_s", ...}, ...],
      "head":      [{"micro_batch", "seq_len", "tp", "forward_s", "backward_s", "activation_bytes"?}, ...],
      "optimizer": [{"layers", "tp", "seconds", "num_params", "num_tensors"}, ...],
      "widths":    [{"model": {...}, "layer": [rows as above]}, ...],   # other model widths (rule 8)
      "retimed":   [layer rows timed again, e.g. by calibrate's compile check],   # bounds (rule 7)
      "ceilings": {...}, "comm": {...}        # not read here (calibration reads them)
    }

Lookup of (model, micro_batch, tp, dtype, recompute, seq_len):

1. The table applies when its ``dtype`` equals the plan's and the model's shape matches the
   measured model (hidden, ffn, heads, kv-heads; the vocabulary too for embedding and head).
   Otherwise the spec roofline answers.
2. Rows with the same ``tp``, ``seq_len`` and ``recompute`` form a curve over ``micro_batch``;
   inside its range the value is interpolated linearly.
3. Otherwise (another tp, sequence length or micro-batch outside the range) the nearest curve
   (same tp first, then nearest sequence length, nearest tp) is carried to the requested tp and
   sequence length point by point (each by the spec roofline's ratio at that micro-batch), made
   non-decreasing again, interpolated, and beyond its micro-batch range extended by the roofline's
   ratio from its nearest end: the table sets the level, the roofline the shape of the curve.
   A layer carried to another sequence length keeps its attention core apart: the row's level
   scales the rest, the core takes its kernel's roofline time (``attention_core_time``). At 2K
   the level is that of GEMMs and launches; at 64K attention is ~70 % of the layer, and 4x H100
   measured it near the roofline (benchmarks/results/long_context_cuda_20261127T042301Z.json).
   A recompute mode's rows are carried by that mode's roofline (not ``none``'s), and from the row
   nearest in tokens per micro-batch (a 64K sequence from the 2K row of 4 sequences, not of 1: a
   launch-bound row's level is the host's, not the GPU's).
4. A recompute mode without rows of its own is derived from ``none``: ``full`` adds the part of
   the forward it repeats (the spec roofline's share, ``recompute_fraction``); ``selective``
   adds the spec attention-core time scaled by measured/spec.
5. Physics over noise: within one (tp, recompute) the tables are made non-decreasing in tokens
   per micro-batch (:func:`planner.cost.measured_tables.monotone_in_tokens`, an isotonic fit), and
   a recompute mode's forward and backward are never below the next lighter mode's (none <=
   selective <= full: the forward does the same work, the backward more).

Live TP rows (``"collectives": true``, ``hexiscale calibrate`` on a host with ``tp`` devices,
executor/profiler/live_tp.py): the layer timed on ``tp`` ranks with its real TP all-reduces, the
slowest rank's figure. A launch-bound TP pass costs far more than shard compute plus modelled
all-reduces (4 x H200, llama-1.3b, TP 2 at micro-batch 1: 2.35 ms forward per layer live, 0.8 ms
shard-only + ~0.2 ms of all-reduce modelled), so where they exist they answer for their TP degree:

6. Live rows form curves of their own (never mixed with the shard-only rows: monotone on their
   own, never carried to another TP degree, never read for memory). A layer at a TP degree with a
   live curve takes its time from that curve (rules 2-3 within the live curves: interpolated,
   carried to another sequence length or micro-batch by the roofline's ratio), and
   :meth:`MeasuredProfile.layer_holds_collectives` tells the stage model not to add the layer's
   own all-reduces again (:mod:`planner.cost.stage`). Live rows are measured at recompute ``none``;
   another mode adds to them what it adds on the shard-only tables (mode minus ``none``, >= 0), so
   modes stay ordered. TP degrees without live rows, and profiles without any (every profile
   from before, all packaged ones), read the shard-only rows exactly as before.

7. A whole GPU's layer is never slower than the same layer on an MPS share of it timed beside it
   (``shares``, same tables kind: live rows against live rows): fewer SMs run the same kernels, issued
   by the same host. A timing's error is added time (a host stall, a one-off cost), so where the pair
   disagrees the whole GPU's figure is the one to lower: its rows (layer, embedding, head) are bounded
   by the share's point by point before its curves are made monotone
   (:func:`planner.cost.measured_tables.bounded`), and its priced layer times by the share's wherever
   both price. A point timed twice (``retimed``: calibrate's compile check times the layer again at
   the end of its run) is bounded the same way. On 4x H100 (2026-11-27) the whole GPU's first rows
   held 30-70 % of added forward time (2.07 / 1.76 ms at micro-batch 1 / 2; the share 1.21, the
   compile check's re-timing of micro-batch 2 1.34, the steps ~1.2 / 1.26): every whole-GPU plan was
   over-predicted by 9-24 %. (The rule first went the other way, the share floored by the whole GPU:
   that carried the whole GPU's added time into the share.)

8. Other widths (``measured.widths``: ``hexiscale calibrate`` times the layer of llama2-7b and 13b at
   TP 1, micro-batches 1 and 2, for the roofline fit's shape terms) time their own model's layer as
   the tables do the profiled model's (rules 2-5, 7; carried to other TP degrees, micro-batches and
   recompute modes by the roofline): a host's own timing of a 7B layer before the roofline fitted to
   every width at once. On 4x H100 (2026-11-27) the 7B layer's forward was timed at 3.72 ms at
   micro-batch 2, the step traced 3.66, the fitted roofline priced ~4.2 (+12 %; its 13B +10 %). They
   time, never size: activation bytes stay the memory formula's for those models.

9. Host-free rows (``"device_times": "full-queue"`` in the meta, :mod:`planner.cost.pass_times`: the
   profiler timed the device from a full launch queue and the host's issue time beside it): a row's
   pass time is ``max(device, host)``, as a step where the host runs ahead pays it, and every rule
   above applies to that figure. Its split into GPU and host shares
   (:meth:`~planner.cost.profile.DeviceProfile.pass_split`) is the rows' own, looked up the same way,
   instead of one inferred from the roofline's kernel counts: a launch-bound row (host above device)
   was read as GPU time wherever its host time exceeded the roofline's host estimate. Rows without
   host times, and every table from before, price exactly as before.

Weight casts: rows marked ``cast_once`` (the profiler made the engine's copies before the timed
passes) price no cast; the profile adds the step's copies once per step (``weight_copy``, added to
each stage's first forward by :mod:`planner.cost.stage`). Unmarked tables were timed on autocast's
path, a cast in every pass, and get nothing more. The roofline that carries either kind (rules 3-4)
is the one the host's compute terms were fitted with (:mod:`planner.calibration.fit`): a cast in
every pass. (Carrying cast-once rows by the cast-once roofline instead moved the 4x H100 64K plans
of tests/planner/test_fidelity_long_context_cp.py by up to +5 points with their recorded terms.)

Activation bytes (``activation_bytes`` column) are first brought to what the memory model counts
per layer (:func:`planner.cost.measured_tables._stage_bytes`: the input in, the weight casts out,
the ``chain`` undone), then follow the same rules, scaled by the memory formula of
:mod:`planner.cost.memory`. The optimizer rows fit ``seconds = fixed + per_param · num_params``
(least squares); the gradient-clipping tail is added from the spec bandwidth.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from planner.catalog import DeviceType
from planner.cost.measured_tables import (
    LIGHTER,
    SHAPE_KEYS,
    Curve,
    MeasuredTables,
    isotonic,
    parse_measured,
    timed_cast_once,
)
from planner.cost.memory import head_activation_bytes, layer_activation_bytes
from planner.cost.ops import CLIP_BYTES_PER_PARAM, DTYPE_BYTES, attention_core_forward
from planner.cost.params import DEFAULT_PARAMS, CostParams
from planner.cost.profile import DeviceProfile, PassTime
from planner.model import ModelSpec


def _interp(xs: tuple[int, ...], ys: tuple[float, ...], x: float) -> float:
    i = bisect.bisect_left(xs, x)
    if xs[i] == x:
        return ys[i]
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


Spec = Callable[[int, int, int], tuple[float, float]]  # (micro_batch, tp, seq_len) -> two spec values


def _carry(measured: float, want: float, have: float, fixed_want: float, fixed_have: float) -> float:
    """``measured`` (a row whose roofline is ``have``) carried to a point whose roofline is ``want``
    (rule 3), the attention core apart: the row's level scales the rest, the core keeps its own
    kernel's roofline time (``fixed_*``). Where the rest is not positive, the plain ratio."""
    rest_have, rest_want = have - fixed_have, want - fixed_want
    rest = measured - fixed_have
    if rest_have <= 0 or rest <= 0 or rest_want < 0:
        return measured * want / have
    return rest * rest_want / rest_have + fixed_want


class MeasuredProfile(DeviceProfile):
    """Measured tables (see the module docstring) over the spec roofline."""

    source = "measured"

    def __init__(self, device: DeviceType, params: CostParams = DEFAULT_PARAMS, memory: MeasuredProfile | None = None,
                 shares: Sequence[MeasuredProfile] = ()):
        """``memory``: the profile whose activation bytes this one reports (an MPS share's full-SM
        twin measured by a newer executor: :meth:`planner.cost.profile_set.ProfileSet.memory_twin`);
        ``shares``: MPS shares of this whole GPU timed beside it, whose times bound this one's from
        above (rule 7, :meth:`planner.cost.profile_set.ProfileSet.share_twins`)."""
        self.memory = memory
        self.shares = tuple(shares)
        # the tables describe the executor that measured them: profiles from before the fused
        # RMSNorm (no meta.fused_rms_norm) saved the norms' fp32 outputs, and the formula that
        # scales their activation rows to other shapes must count them too
        tables = parse_measured(device.measured or {}, f"devices.{device.key}.measured",
                                [share.tables for share in self.shares])
        meta = (device.measured or {}).get("meta") or {}
        # The roofline that carries the tables (and stands in where they have no row) is the one the
        # host's compute terms were fitted with (planner.calibration.fit): a weight cast in every pass.
        # Tables timed with the step's copies made beforehand (timed_cast_once) price those copies
        # nowhere: weight_copy adds them once per step; tables timed on autocast's path hold the casts.
        super().__init__(device, replace(params, fused_rms_norm=meta.get("fused_rms_norm") is True, cast_once=False))
        self.copies_per_step = params.cast_once and timed_cast_once(device.measured or {})
        self.tables: MeasuredTables = tables
        self.live_tps = frozenset(c.tp for c in self.tables.curves["layer"] if c.collectives)

    def covers(self, kind: str, model: ModelSpec, dtype: str) -> bool:
        """Whether the tables apply to ``model`` in ``dtype`` for ``kind`` ('layer', 'embedding', 'head')."""
        return self._tables_for(kind, model, dtype) is not None

    def _tables_for(self, kind: str, model: ModelSpec, dtype: str, widths: bool = True) -> MeasuredTables | None:
        """The tables that time ``kind`` of ``model``: the profiled model's, else (layers, ``widths``) those
        of another width the calibration timed on this GPU (rule 8), else None."""
        for t in (self.tables, *(self.tables.widths if widths and kind == "layer" else ())):
            if dtype == t.dtype and all(getattr(model, k) == t.shape[k] for k in SHAPE_KEYS[kind]) and t.curves[kind]:
                return t
        return None

    def layer_holds_collectives(self, model: ModelSpec, micro_batch: int, tp: int = 1, dtype: str = "bf16",
                                seq_len: int | None = None) -> bool:
        """True where the tables hold live rows of ``tp`` for ``model`` (rule 6): then the layer time
        includes the layer's own TP all-reduces."""
        return tp in self.live_tps and self._tables_for("layer", model, dtype, widths=False) is not None

    def _lookup(self, tables: MeasuredTables, kind: str, recompute: str, mb: int, tp: int, seq: int, spec: Spec,
                value: Callable[[Curve], tuple[tuple[float, ...], tuple[float, ...]] | None], live: bool = False,
                fixed: Spec | None = None) -> tuple[float, float] | None:
        cands = [(c, v) for c in tables.curves[kind] if c.recompute == recompute and c.collectives == live
                 and (not live or c.tp == tp) for v in [value(c)] if v is not None]
        if not cands:
            return None
        for c, (ys0, ys1) in cands:
            if c.tp == tp and c.seq_len == seq and c.mbs[0] <= mb <= c.mbs[-1]:
                return _interp(c.mbs, ys0, mb), _interp(c.mbs, ys1, mb)
        c, (ys0, ys1) = min(cands, key=lambda cv: (cv[0].tp != tp, abs(math.log(cv[0].seq_len / seq)),
                                                   abs(math.log(cv[0].tp / tp))))
        if c.seq_len != seq and fixed is not None:  # a layer at another sequence length: rule 3's token carry
            j = min(range(len(c.mbs)), key=lambda i: abs(math.log(c.mbs[i] * c.seq_len / (mb * seq))))
            want, have = spec(mb, tp, seq), spec(c.mbs[j], c.tp, c.seq_len)
            fw, fh = fixed(mb, tp, seq), fixed(c.mbs[j], c.tp, c.seq_len)
            return _carry(ys0[j], want[0], have[0], fw[0], fh[0]), _carry(ys1[j], want[1], have[1], fw[1], fh[1])
        # the curve's points carried to the wanted (tp, seq), each by the roofline's ratio at its own
        # micro-batch, and kept non-decreasing; beyond its micro-batch range the roofline extends it
        moved0, moved1 = [], []
        for j, m in enumerate(c.mbs):
            want, have = spec(m, tp, seq), spec(m, c.tp, c.seq_len)
            if fixed is None or c.seq_len == seq:
                moved0.append(ys0[j] * want[0] / have[0])
                moved1.append(ys1[j] * want[1] / have[1])
            else:
                fw, fh = fixed(m, tp, seq), fixed(m, c.tp, c.seq_len)
                moved0.append(_carry(ys0[j], want[0], have[0], fw[0], fh[0]))
                moved1.append(_carry(ys1[j], want[1], have[1], fw[1], fh[1]))
        moved0, moved1 = isotonic(moved0), isotonic(moved1)
        if c.mbs[0] <= mb <= c.mbs[-1]:
            return _interp(c.mbs, tuple(moved0), mb), _interp(c.mbs, tuple(moved1), mb)
        j = 0 if mb < c.mbs[0] else len(c.mbs) - 1
        want, have = spec(mb, tp, seq), spec(c.mbs[j], tp, seq)
        return moved0[j] * want[0] / have[0], moved1[j] * want[1] / have[1]

    def _times(self, kind: str, model: ModelSpec, mb: int, tp: int, dtype: str, recompute: str, seq: int,
               spec_fn: Callable[..., PassTime], live: bool = False) -> PassTime | None:
        def spec(b: int, t: int, s: int) -> tuple[float, float]:
            pt = spec_fn(model, b, t, dtype, s) if kind != "layer" else spec_fn(model, b, t, dtype, recompute, s)
            return pt.forward_s, pt.backward_s

        def attention(b: int, t: int, s: int) -> tuple[float, float]:
            return self.attention_core_time(model, b, t, dtype, recompute, s)

        tables = self._tables_for(kind, model, dtype)
        if tables is None:
            return None
        got = self._lookup(tables, kind, recompute, mb, tp, seq, spec, lambda c: (c.fwd, c.bwd), live,
                           attention if kind == "layer" else None)
        return PassTime(*got) if got is not None else None

    def _measured_split(self, kind: str, model: ModelSpec, micro_batch: int, tp: int, dtype: str, recompute: str,
                        seq_len: int) -> tuple[PassTime, PassTime] | None:
        """(device, host) seconds of the pass from host-free rows (rule 9): the curves that price it
        (its recompute mode's own rows; the live ones where the layer holds its collectives), looked
        up as its time is (rules 2-3) but carried to another point by the roofline's GPU time (device)
        and host time (host) apart: issuing a TP shard's kernels takes the host as long as the whole
        layer's. None where the rows carry no host times."""
        tables = self._tables_for(kind, model, dtype)
        live = kind == "layer" and self.layer_holds_collectives(model, micro_batch, tp, dtype, seq_len)
        if tables is None or (live and recompute != "none"):  # a mode added to live rows (rule 6): no split
            return None
        mode = recompute if kind == "layer" else "none"

        def roofline(side: int) -> Spec:
            def spec(b: int, t: int, s: int) -> tuple[float, float]:
                pt = self.roofline_split(kind, model, b, t, dtype, mode, s)[side]
                return max(pt.forward_s, 1e-12), max(pt.backward_s, 1e-12)  # no host terms: ratio 1
            return spec

        def attention(b: int, t: int, s: int) -> tuple[float, float]:
            return self.attention_core_time(model, b, t, dtype, mode, s)

        device = self._lookup(tables, kind, mode, micro_batch, tp, seq_len, roofline(0), lambda c: c.device, live,
                              attention if kind == "layer" else None)
        host = self._lookup(tables, kind, mode, micro_batch, tp, seq_len, roofline(1), lambda c: c.host, live)
        return None if device is None or host is None else (PassTime(*device), PassTime(*host))

    def _layer(self, model: ModelSpec, micro_batch: int, tp: int, dtype: str, recompute: str,
               seq_len: int) -> PassTime:
        """The layer from this GPU's tables, never above an MPS share's of it (rule 7)."""
        own = self._own_layer(model, micro_batch, tp, dtype, recompute, seq_len)
        live = self.layer_holds_collectives(model, micro_batch, tp, dtype, seq_len)
        for share in self.shares:
            if self.covers("layer", model, dtype) and share.covers("layer", model, dtype) and \
                    share.layer_holds_collectives(model, micro_batch, tp, dtype, seq_len) == live:
                less = share._own_layer(model, micro_batch, tp, dtype, recompute, seq_len)
                own = PassTime(min(own.forward_s, less.forward_s), min(own.backward_s, less.backward_s))
        return own

    def _own_layer(self, model: ModelSpec, micro_batch: int, tp: int, dtype: str, recompute: str,
                   seq_len: int) -> PassTime:
        shard = self._shard_layer(model, micro_batch, tp, dtype, recompute, seq_len)
        if not self.layer_holds_collectives(model, micro_batch, tp, dtype, seq_len):
            return shard
        live = self._times("layer", model, micro_batch, tp, dtype, "none", seq_len, self._spec_layer, live=True)
        if live is None or recompute == "none":  # (never None: a live curve of this tp exists)
            return live or shard
        # the recompute mode's extra as the shard-only tables have it (rule 6)
        base = self._shard_layer(model, micro_batch, tp, dtype, "none", seq_len)
        return PassTime(live.forward_s + max(0.0, shard.forward_s - base.forward_s),
                        live.backward_s + max(0.0, shard.backward_s - base.backward_s))

    def _shard_layer(self, model: ModelSpec, micro_batch: int, tp: int, dtype: str, recompute: str,
                     seq_len: int) -> PassTime:
        """The layer from the shard-only rows (compute of one TP rank, no collectives)."""
        if not self.covers("layer", model, dtype):
            return self._spec_layer(model, micro_batch, tp, dtype, recompute, seq_len)
        if recompute != "none":
            own = self._times("layer", model, micro_batch, tp, dtype, recompute, seq_len, self._spec_layer)
            if own is not None:  # more recompute is never faster: not below the next lighter mode
                lighter = self._shard_layer(model, micro_batch, tp, dtype, LIGHTER[recompute], seq_len)
                return PassTime(max(own.forward_s, lighter.forward_s), max(own.backward_s, lighter.backward_s))
        got = self._times("layer", model, micro_batch, tp, dtype, "none", seq_len, self._spec_layer)
        if got is None:
            return self._spec_layer(model, micro_batch, tp, dtype, recompute, seq_len)
        extra = 0.0
        if recompute == "full":
            extra = got.forward_s * self.recompute_fraction(model, micro_batch, tp, dtype, seq_len)
        elif recompute == "selective":
            base = self._spec_layer(model, micro_batch, tp, dtype, "none", seq_len).forward_s
            attn = self.op_time(attention_core_forward(model, micro_batch, seq_len, tp, DTYPE_BYTES[dtype]), dtype)
            extra = attn * got.forward_s / base
        return PassTime(got.forward_s, got.backward_s + extra)

    def _embedding(self, model: ModelSpec, micro_batch: int, tp: int, dtype: str, seq_len: int) -> PassTime:
        got = None
        if self.covers("embedding", model, dtype):
            got = self._times("embedding", model, micro_batch, tp, dtype, "none", seq_len, self._spec_embedding)
        return got if got is not None else self._spec_embedding(model, micro_batch, tp, dtype, seq_len)

    def _head(self, model: ModelSpec, micro_batch: int, tp: int, dtype: str, seq_len: int) -> PassTime:
        got = None
        if self.covers("head", model, dtype):
            got = self._times("head", model, micro_batch, tp, dtype, "none", seq_len, self._spec_head)
        return got if got is not None else self._spec_head(model, micro_batch, tp, dtype, seq_len)

    def activation_bytes(self, kind: str, model: ModelSpec, micro_batch: int, tp: int = 1, dtype: str = "bf16",
                         recompute: str = "none", seq_len: int | None = None) -> float | None:
        if self.memory is not None:  # the SM share changes time, not what a layer keeps
            return self.memory.activation_bytes(kind, model, micro_batch, tp, dtype, recompute, seq_len)
        seq = seq_len or model.seq_len
        tables = self._tables_for(kind, model, dtype, widths=False)  # the widths' rows time, not size
        if kind not in ("layer", "head") or tables is None:
            return None
        p = self.params

        def spec(b: int, t: int, s: int) -> tuple[float, float]:
            v = (layer_activation_bytes(model, b, t, dtype, recompute, s, p) if kind == "layer"
                 else head_activation_bytes(model, b, t, dtype, s, p))
            return v, v

        got = self._lookup(tables, kind, recompute if kind == "layer" else "none", micro_batch, tp, seq, spec,
                           lambda c: (c.act, c.act) if c.act is not None else None)
        return got[0] if got is not None else None

    def optimizer_time(self, num_params: float, num_tensors: int, dtype: str = "bf16") -> float:
        fit = self.tables.optimizer_fit
        if fit is None:
            return super().optimizer_time(num_params, num_tensors, dtype)
        bw = self.device.memory_bandwidth_GBps * 1e9 * self.params.memory_efficiency
        return fit[0] + fit[1] * num_params + num_params * CLIP_BYTES_PER_PARAM / bw

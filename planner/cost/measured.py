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
   per micro-batch (:func:`monotone_in_tokens`, an isotonic fit), and a recompute mode's forward
   and backward are never below the next lighter mode's (none <= selective <= full: the forward
   does the same work, the backward more).

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

7. An MPS share's layer is never faster than the same layer on the whole GPU measured beside it
   (``full_sm``, same tables kind: live rows against live rows): fewer SMs run the same kernels,
   issued by the same host. Where its launch-bound rows say otherwise that is timing noise, and
   it inverted plans: on 4x H200 (2026-11-27) the 50 % share's live TP 2 forward (1.57 ms at
   micro-batch 2) was timed under the full GPU's (1.96 ms), so TP 2 x DP 2 priced the share's pair
   faster in forward than the full pair (324 vs 393 ms), where both ran ~500 ms; -15.1 % -> -7.9 %.

Weight casts: rows marked ``cast_once`` (the profiler made the engine's copies before the timed
passes) price no cast; the profile adds the step's copies once per step (``weight_copy``, added to
each stage's first forward by :mod:`planner.cost.stage`). Unmarked tables were timed on autocast's
path, a cast in every pass, and get nothing more. The roofline that carries either kind (rules 3-4)
is the one the host's compute terms were fitted with (:mod:`planner.calibration.fit`): a cast in
every pass. (Carrying cast-once rows by the cast-once roofline instead moved the 4x H100 64K plans
of tests/planner/test_fidelity_long_context_cp.py by up to +5 points with their recorded terms.)

Activation bytes (``activation_bytes`` column) are first brought to what the memory model counts
per layer (:func:`_stage_bytes`: the input in, the weight casts out, the ``chain`` undone), then
follow the same rules, scaled by the memory formula of :mod:`planner.cost.memory`. The optimizer rows fit
``seconds = fixed + per_param · num_params`` (least squares); the gradient-clipping tail is added
from the spec bandwidth.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from planner.catalog import DeviceType
from planner.cost.memory import head_activation_bytes, layer_activation_bytes
from planner.cost.ops import CLIP_BYTES_PER_PARAM, DTYPE_BYTES, attention_core_forward
from planner.cost.params import DEFAULT_PARAMS, CostParams
from planner.cost.profile import DeviceProfile, PassTime
from planner.errors import SpecError
from planner.layout import layer_numel
from planner.model import MODEL_LIMITS, RECOMPUTE_MODES, ModelSpec, model_from_dict
from planner.ranges import check_int, shown

MEASURED_FORMAT = "hexiscale.measured/1"
LIGHTER = {"selective": "none", "full": "selective"}  # the recompute mode that does less work
# the largest micro-batch, sequence length and TP degree a row may hold (the model's own limits)
ROW_LIMITS = {"micro_batch": 1 << 24, "seq_len": MODEL_LIMITS["seq_len"], "tp": MODEL_LIMITS["num_heads"]}
KINDS = ("layer", "embedding", "head")
SHAPE_KEYS = {"layer": ("hidden_size", "ffn_hidden_size", "num_heads", "num_kv_heads"),
              "embedding": ("hidden_size", "vocab_size"), "head": ("hidden_size", "vocab_size")}


@dataclass(frozen=True)
class Curve:
    """Rows of one (tp, seq_len, recompute) over micro-batch sizes; values in seconds / bytes."""

    tp: int
    seq_len: int
    recompute: str
    mbs: tuple[int, ...]
    fwd: tuple[float, ...]
    bwd: tuple[float, ...]
    act: tuple[float, ...] | None
    collectives: bool = False  # live TP rows: the layer's TP all-reduces are inside the times


@dataclass(frozen=True)
class MeasuredTables:
    dtype: str
    shape: dict[str, int]
    curves: dict[str, list[Curve]]
    optimizer_fit: tuple[float, float] | None  # (fixed seconds per step, seconds per parameter)


def _num(x: Any, low_ok: bool = False) -> bool:
    """A finite number > 0 (``low_ok``: >= 0), also for integers too large for a float."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return False
    try:
        v = float(x)
    except OverflowError:
        return False
    return (0 <= v if low_ok else 0 < v) and v < math.inf


def _fit_optimizer(rows: list[Mapping[str, Any]], path: str) -> tuple[float, float] | None:
    """Least squares of ``seconds = fixed + per_param · num_params`` over the rows. (The profiler's
    rows grow tensors and parameters together, so a per-tensor term cannot be told apart from the
    per-parameter one; the fused multi-tensor AdamW's launches are the fixed part.)"""
    pts = []
    for i, r in enumerate(rows):
        if not (isinstance(r, Mapping) and all(_num(r.get(k)) for k in ("seconds", "num_params", "num_tensors"))):
            raise SpecError(f"{path}[{i}]", "needs positive seconds, num_params and num_tensors", "re-run the profiler")
        pts.append((float(r["num_params"]), float(r["seconds"])))
    if not pts:
        return None
    n = len(pts)
    mx, my = sum(p for p, _ in pts) / n, sum(s for _, s in pts) / n
    sxx = sum((p - mx) ** 2 for p, _ in pts)
    if n >= 2 and sxx > 0:
        slope = sum((p - mx) * (s - my) for p, s in pts) / sxx
        fixed = my - slope * mx
        if slope > 0 and fixed >= 0:
            return fixed, slope
    return 0.0, my / mx  # one point, or a fit with a negative part: everything per parameter


def parse_measured(data: Mapping[str, Any], path: str) -> MeasuredTables:
    """Validate a ``measured`` section (see the module docstring)."""
    if not isinstance(data, Mapping):
        raise SpecError(path, f"expected a mapping, got {type(data).__name__}", "re-run the profiler")
    if data.get("format") != MEASURED_FORMAT:
        raise SpecError(f"{path}.format", f"expected {MEASURED_FORMAT!r}, got {shown(data.get('format'))}",
                        "re-run the profiler")
    if not isinstance(data.get("meta") or {}, Mapping):
        raise SpecError(f"{path}.meta", f"expected a mapping, got {shown(data.get('meta'))}", "re-run the profiler")
    dtype = data.get("dtype")
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise SpecError(f"{path}.dtype", f"{shown(dtype)} is not bf16, fp16 or fp32", "record the compute dtype")
    model = data.get("model")
    keys = {k for v in SHAPE_KEYS.values() for k in v}
    if not isinstance(model, Mapping) or any(not isinstance(model.get(k), int) for k in keys):
        raise SpecError(f"{path}.model", f"needs integer {', '.join(sorted(keys))}", "record the profiled model")
    measured_model = model_from_dict(model, f"{path}.model")
    curves: dict[str, list[Curve]] = {}
    for kind in KINDS:
        rows = data.get(kind, [])
        if not isinstance(rows, list):
            raise SpecError(f"{path}.{kind}", "expected a list of rows", "re-run the profiler")
        groups: dict[tuple[int, int, str, bool], list[Mapping[str, Any]]] = {}
        for i, r in enumerate(rows):
            p = f"{path}.{kind}[{i}]"
            if not isinstance(r, Mapping) or not (_num(r.get("forward_s")) and _num(r.get("backward_s"))):
                raise SpecError(p, "needs integer micro_batch, seq_len, tp and positive forward_s, backward_s",
                                "re-run the profiler")
            for key, high in ROW_LIMITS.items():
                check_int(f"{p}.{key}", r.get(key), 1, high, "re-run the profiler")
            chain = r.get("chain", 1)
            if chain is not None and (isinstance(chain, bool) or not isinstance(chain, int) or not 1 <= chain <= 1000):
                raise SpecError(f"{p}.chain", f"expected an integer in [1, 1000], got {chain!r}", "re-run the profiler")
            rc = r.get("recompute", "none")
            if rc not in RECOMPUTE_MODES:
                raise SpecError(f"{p}.recompute", f"{rc!r} is not one of {', '.join(RECOMPUTE_MODES)}",
                                "re-run the profiler")
            live = _live_flag(kind, r, p)
            groups.setdefault((r["tp"], r["seq_len"], rc, live), []).append(r)
        out = []
        for (tp, seq, rc, live), rs in sorted(groups.items()):
            rs = sorted(rs, key=lambda r: r["micro_batch"])
            if len({r["micro_batch"] for r in rs}) != len(rs):
                raise SpecError(f"{path}.{kind}", f"two rows for micro_batch of tp={tp} seq_len={seq} {rc}"
                                + (" with collectives" if live else ""), "keep one row per point")
            acts = tuple(_stage_bytes(kind, r, measured_model, str(dtype)) for r in rs) if not live and all(
                _num(r.get("activation_bytes"), low_ok=True) for r in rs) else None
            out.append(Curve(tp, seq, rc, tuple(r["micro_batch"] for r in rs),
                             tuple(float(r["forward_s"]) for r in rs), tuple(float(r["backward_s"]) for r in rs), acts,
                             live))
        curves[kind] = monotone_in_tokens(out)
    opt_rows = data.get("optimizer", [])
    if not isinstance(opt_rows, list):
        raise SpecError(f"{path}.optimizer", "expected a list of rows", "re-run the profiler")
    return MeasuredTables(str(dtype), {k: int(model[k]) for k in keys}, curves,
                          _fit_optimizer(opt_rows, f"{path}.optimizer"))


def timed_cast_once(data: Mapping[str, Any]) -> bool:
    """Whether a ``measured`` section's layer and head rows were timed on the engine's cast-once path
    (every row marked ``cast_once``: the profiler made the step's copies before the timed passes,
    executor/profiler/compute.py). Rows from before (the packaged tables, 2026-11-27 01:15 UTC and
    earlier) ran autocast's cast in every pass. Live TP rows carry no mark (they are timed by the same
    profiler as the shard-only rows beside them) and embedding rows cast nothing; no rows: True."""
    rows = [r for kind in ("layer", "head") for r in data.get(kind) or []
            if isinstance(r, Mapping) and not r.get("collectives")]
    return all(r.get("cast_once") is True for r in rows)


def _live_flag(kind: str, row: Mapping[str, Any], path: str) -> bool:
    """A row's ``collectives`` flag (absent: False), checked: live rows are layer rows at TP > 1 and
    recompute ``none`` (what the profiler measures; rule 6 of the module docstring)."""
    live = row.get("collectives", False)
    if not isinstance(live, bool):
        raise SpecError(f"{path}.collectives", f"expected true or false, got {shown(live)}", "re-run the profiler")
    if live and (kind != "layer" or row["tp"] < 2 or row.get("recompute", "none") != "none"):
        raise SpecError(f"{path}.collectives", f"live rows are layer rows at tp >= 2 and recompute none, got a "
                        f"{kind} row at tp={row['tp']} recompute={row.get('recompute', 'none')}",
                        "drop the flag or the row")
    return live


def isotonic(values: list[float]) -> list[float]:
    """The non-decreasing sequence closest to ``values`` in least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in values:
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, n2 = blocks.pop()
            m1, n1 = blocks[-1]
            blocks[-1] = [(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2]
    return [m for m, n in blocks for _ in range(int(n))]


def monotone_in_tokens(curves: list[Curve]) -> list[Curve]:
    """Measured times obey physics before anything reads them: within one (tp, recompute), more
    tokens per micro-batch never take less time (points ordered by tokens, then by sequence length,
    so at equal tokens the longer sequence is not cheaper). Timing noise (a larger micro-batch
    measured faster) is replaced by the isotonic fit of its neighbours, so noise cannot decide a plan.
    Live TP curves (``collectives``) are fitted apart from the shard-only ones of the same TP degree."""
    out: dict[tuple[int, int, str, bool], Curve] = {}
    by_mode: dict[tuple[int, str, bool], list[Curve]] = {}
    for c in curves:
        by_mode.setdefault((c.tp, c.recompute, c.collectives), []).append(c)
    for group in by_mode.values():
        points = sorted((mb * c.seq_len, c.seq_len, ci, j) for ci, c in enumerate(group)
                        for j, mb in enumerate(c.mbs))
        fwd = isotonic([group[ci].fwd[j] for _, _, ci, j in points])
        bwd = isotonic([group[ci].bwd[j] for _, _, ci, j in points])
        new = {ci: (list(c.fwd), list(c.bwd)) for ci, c in enumerate(group)}
        for (_, _, ci, j), f, b in zip(points, fwd, bwd):
            new[ci][0][j], new[ci][1][j] = f, b
        for ci, c in enumerate(group):
            out[(c.tp, c.seq_len, c.recompute, c.collectives)] = Curve(
                c.tp, c.seq_len, c.recompute, c.mbs, tuple(new[ci][0]), tuple(new[ci][1]), c.act, c.collectives)
    return [out[(c.tp, c.seq_len, c.recompute, c.collectives)] for c in curves]


def _stage_bytes(kind: str, row: Mapping[str, Any], model: ModelSpec, dtype: str) -> float:
    """The profiler's ``activation_bytes`` as :func:`planner.cost.memory.stage_memory` counts a layer
    (or the head): with its input, without the compute-dtype weight casts (the memory model adds the
    stage's one cast-once copy, :func:`planner.cost.memory.weight_copy_bytes`).

    The profiler (executor/profiler/compute.py) records what a forward leaves allocated less its
    output, divided by ``chain`` = k when k applications of the same layer run back to back in one
    autocast region: k layers' saved tensors, the inputs of all but the first (the first input
    existed before), and ONE set of weight casts (autocast caches them within the region)::

        measured = A + (k-1)/k · I + C/k      ->      A + I = measured + I/k - C/k

    with ``I = T·h·4`` (the profiler feeds an fp32 residual) and ``C`` = e bytes per matmul
    parameter of the shard (0 in fp32 and under full recompute, whose casts are not kept, and in rows
    marked ``cast_once``: the profiler made the engine's copies before the timed forward)."""
    k = int(row.get("chain", 1) or 1)
    tp, tokens = int(row["tp"]), int(row["micro_batch"]) * int(row["seq_len"])
    e = DTYPE_BYTES[dtype]
    cast = e != 4 and row.get("cast_once") is not True  # the forward allocated autocast's weight casts
    if kind == "layer":
        matmul = layer_numel(model)[0] / tp
        casts = e * matmul if cast and row.get("recompute", "none") != "full" else 0.0
    else:
        casts = e * model.vocab_size * model.hidden_size / tp if cast else 0.0
    inp = tokens * model.hidden_size * 4.0
    return float(row["activation_bytes"]) + (inp - casts) / k


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
                 full_sm: MeasuredProfile | None = None):
        """``memory``: the profile whose activation bytes this one reports (an MPS share's full-SM
        twin measured by a newer executor: :meth:`planner.cost.profile_set.ProfileSet.memory_twin`);
        ``full_sm``: an MPS share's full GPU measured on the same host, whose layer times bound this
        one's from below (rule 7, :meth:`planner.cost.profile_set.ProfileSet.full_sm_twin`)."""
        self.memory = memory
        self.full_sm = full_sm
        # the tables describe the executor that measured them: profiles from before the fused
        # RMSNorm (no meta.fused_rms_norm) saved the norms' fp32 outputs, and the formula that
        # scales their activation rows to other shapes must count them too
        tables = parse_measured(device.measured or {}, f"devices.{device.key}.measured")
        meta = (device.measured or {}).get("meta") or {}
        # The roofline that carries the tables (and stands in where they have no row) is the one the
        # host's compute terms were fitted with (planner.calibration.fit): a weight cast in every pass.
        # Tables timed with the step's copies made beforehand (timed_cast_once) price those copies
        # nowhere: weight_copy adds them once per step; tables timed on autocast's path hold the casts.
        super().__init__(device, replace(params, fused_rms_norm=meta.get("fused_rms_norm") is True, cast_once=False))
        self.copies_per_step = params.cast_once and timed_cast_once(device.measured or {})
        self.tables = tables
        self.live_tps = frozenset(c.tp for c in self.tables.curves["layer"] if c.collectives)

    def covers(self, kind: str, model: ModelSpec, dtype: str) -> bool:
        """Whether the tables apply to ``model`` in ``dtype`` for ``kind`` ('layer', 'embedding', 'head')."""
        t = self.tables
        return dtype == t.dtype and all(getattr(model, k) == t.shape[k] for k in SHAPE_KEYS[kind]) and bool(
            t.curves[kind])

    def layer_holds_collectives(self, model: ModelSpec, micro_batch: int, tp: int = 1, dtype: str = "bf16",
                                seq_len: int | None = None) -> bool:
        """True where the tables hold live rows of ``tp`` for ``model`` (rule 6): then the layer time
        includes the layer's own TP all-reduces."""
        return tp in self.live_tps and self.covers("layer", model, dtype)

    def _lookup(self, kind: str, recompute: str, mb: int, tp: int, seq: int, spec: Spec,
                value: Callable[[Curve], tuple[tuple[float, ...], tuple[float, ...]] | None], live: bool = False,
                fixed: Spec | None = None) -> tuple[float, float] | None:
        cands = [(c, v) for c in self.tables.curves[kind] if c.recompute == recompute and c.collectives == live
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

        got = self._lookup(kind, recompute, mb, tp, seq, spec, lambda c: (c.fwd, c.bwd), live,
                           attention if kind == "layer" else None)
        return PassTime(*got) if got is not None else None

    def _layer(self, model: ModelSpec, micro_batch: int, tp: int, dtype: str, recompute: str,
               seq_len: int) -> PassTime:
        """The layer from this share's tables, never below its full-SM twin's (rule 7)."""
        own = self._own_layer(model, micro_batch, tp, dtype, recompute, seq_len)
        whole = self.full_sm
        if whole is None or not (self.covers("layer", model, dtype) and whole.covers("layer", model, dtype)) \
                or whole.layer_holds_collectives(model, micro_batch, tp, dtype, seq_len) != \
                self.layer_holds_collectives(model, micro_batch, tp, dtype, seq_len):
            return own
        full = whole._layer(model, micro_batch, tp, dtype, recompute, seq_len)
        return PassTime(max(own.forward_s, full.forward_s), max(own.backward_s, full.backward_s))

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
        if kind not in ("layer", "head") or not self.covers(kind, model, dtype):
            return None
        p = self.params

        def spec(b: int, t: int, s: int) -> tuple[float, float]:
            v = (layer_activation_bytes(model, b, t, dtype, recompute, s, p) if kind == "layer"
                 else head_activation_bytes(model, b, t, dtype, s, p))
            return v, v

        got = self._lookup(kind, recompute if kind == "layer" else "none", micro_batch, tp, seq, spec,
                           lambda c: (c.act, c.act) if c.act is not None else None)
        return got[0] if got is not None else None

    def optimizer_time(self, num_params: float, num_tensors: int, dtype: str = "bf16") -> float:
        fit = self.tables.optimizer_fit
        if fit is None:
            return super().optimizer_time(num_params, num_tensors, dtype)
        bw = self.device.memory_bandwidth_GBps * 1e9 * self.params.memory_efficiency
        return fit[0] + fit[1] * num_params + num_params * CLIP_BYTES_PER_PARAM / bw

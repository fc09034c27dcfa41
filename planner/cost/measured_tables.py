"""Measured profile tables (``hexiscale.measured/1``): their rows parsed and checked, one field at
a time, into per-(TP, sequence, recompute) curves over micro-batch sizes, made monotone where timing
noise broke the physics (:func:`isotonic`). How a profile prices from them:
:mod:`planner.cost.measured`."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from planner.cost.ops import DTYPE_BYTES
from planner.cost.pass_times import host_free, pass_seconds, split_times
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
    # host-free rows (planner.cost.pass_times): fwd/bwd are max(device, host); these keep the two apart
    device: tuple[tuple[float, ...], tuple[float, ...]] | None = None  # (forward, backward) device seconds
    host: tuple[tuple[float, ...], tuple[float, ...]] | None = None  # (forward, backward) host seconds


@dataclass(frozen=True)
class MeasuredTables:
    dtype: str
    shape: dict[str, int]
    curves: dict[str, list[Curve]]
    optimizer_fit: tuple[float, float] | None  # (fixed seconds per step, seconds per parameter)
    widths: tuple[MeasuredTables, ...] = ()  # layer tables of other model widths (``measured.widths``)


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


def parse_measured(data: Mapping[str, Any], path: str, bounds: Sequence[MeasuredTables] = ()) -> MeasuredTables:
    """Validate a ``measured`` section (see the module docstring). ``bounds``: tables of the same model
    and dtype whose times bound these from above, point by point, before the curves are made
    monotone (an MPS share of this GPU timed beside it: :func:`bounded`)."""
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
    full_queue = host_free(data)
    curves: dict[str, list[Curve]] = {}
    for kind in KINDS:
        out = _curves(kind, data.get(kind, []), f"{path}.{kind}", measured_model, str(dtype), full_queue)
        caps = [c for b in bounds if b.dtype == dtype and all(b.shape.get(k) == model[k] for k in SHAPE_KEYS[kind])
                for c in b.curves[kind]]
        if kind == "layer":  # the same points timed again (rule 7's twin in time: the lower figure holds)
            caps += _curves(kind, data.get("retimed", []), f"{path}.retimed", measured_model, str(dtype), full_queue)
        curves[kind] = monotone_in_tokens([bounded(c, caps) for c in out])
    opt_rows = data.get("optimizer", [])
    if not isinstance(opt_rows, list):
        raise SpecError(f"{path}.optimizer", "expected a list of rows", "re-run the profiler")
    return MeasuredTables(str(dtype), {k: int(model[k]) for k in keys}, curves,
                          _fit_optimizer(opt_rows, f"{path}.optimizer"),
                          _widths(data, path, [w for b in bounds for w in b.widths]))


def _widths(data: Mapping[str, Any], path: str, bounds: Sequence[MeasuredTables]) -> tuple[MeasuredTables, ...]:
    """``measured.widths`` (``hexiscale calibrate``: the layer of other model widths, timed on the same
    GPU by the same profiler) as layer tables of their own (``bounds``: the bounding tables' widths)."""
    widths = data.get("widths") or []
    if not isinstance(widths, list):
        raise SpecError(f"{path}.widths", "expected a list of {model, layer} entries", "re-run hexiscale calibrate")
    out = []
    for i, w in enumerate(widths):
        if not isinstance(w, Mapping):
            raise SpecError(f"{path}.widths[{i}]", "expected a {model, layer} mapping", "re-run hexiscale calibrate")
        section = {"format": MEASURED_FORMAT, "dtype": data.get("dtype"), "model": w.get("model"),
                   "layer": w.get("layer", []), "meta": data.get("meta") or {}}
        out.append(parse_measured(section, f"{path}.widths[{i}]", bounds))
    return tuple(out)


def _curves(kind: str, rows: Any, path: str, measured_model: ModelSpec, dtype: str,
            full_queue: bool = False) -> list[Curve]:
    """``rows`` of one table, checked, as curves over micro-batch sizes (not yet monotone). ``full_queue``
    (host-free rows, :mod:`planner.cost.pass_times`): a curve's times are ``max(device, host)`` per
    row, and where every row carries its host time the curve keeps device and host apart too."""
    if not isinstance(rows, list):
        raise SpecError(path, "expected a list of rows", "re-run the profiler")
    groups: dict[tuple[int, int, str, bool], list[Mapping[str, Any]]] = {}
    for i, r in enumerate(rows):
        p = f"{path}[{i}]"
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
            raise SpecError(path, f"two rows for micro_batch of tp={tp} seq_len={seq} {rc}"
                            + (" with collectives" if live else ""), "keep one row per point")
        acts = tuple(_stage_bytes(kind, r, measured_model, dtype) for r in rs) if not live and all(
            _num(r.get("activation_bytes"), low_ok=True) for r in rs) else None
        out.append(Curve(tp, seq, rc, tuple(r["micro_batch"] for r in rs),
                         tuple(pass_seconds(r, "forward_s", full_queue) for r in rs),
                         tuple(pass_seconds(r, "backward_s", full_queue) for r in rs), acts, live,
                         *_device_host(rs, full_queue)))
    return out


Pair = tuple[tuple[float, ...], tuple[float, ...]]


def _device_host(rows: list[Mapping[str, Any]], full_queue: bool) -> tuple[Pair | None, Pair | None]:
    """(device, host) of a curve's rows, each as (forward, backward) seconds; (None, None) unless every
    row is host-free with its host times."""
    f = [split_times(r, "forward_s", full_queue) for r in rows]
    b = [split_times(r, "backward_s", full_queue) for r in rows]
    fs, bs = [t for t in f if t is not None], [t for t in b if t is not None]
    if len(fs) < len(rows) or len(bs) < len(rows):
        return None, None
    return ((tuple(d for d, _ in fs), tuple(d for d, _ in bs)),
            (tuple(h for _, h in fs), tuple(h for _, h in bs)))


def timed_cast_once(data: Mapping[str, Any]) -> bool:
    """Whether a ``measured`` section's layer and head rows were timed on the engine's cast-once path
    (every row marked ``cast_once``: the profiler made the step's copies before the timed passes,
    executor/profiler/compute.py). Rows from before (the packaged tables, 2026-11-27 01:15 UTC and
    earlier) ran autocast's cast in every pass. Live TP rows carry no mark (they are timed by the same
    profiler as the shard-only rows beside them) and embedding rows cast nothing; no rows: True."""
    rows = [r for kind in ("layer", "head") for r in _rows(data, kind)
            if isinstance(r, Mapping) and not r.get("collectives")]
    return all(r.get("cast_once") is True for r in rows)


def _rows(data: Mapping[str, Any], kind: str) -> list[Any]:
    """A table's rows, none where it is not a list (:func:`parse_measured` says what is wrong)."""
    rows = data.get(kind)
    return rows if isinstance(rows, list) else []


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


def bounded(curve: Curve, others: Sequence[Curve]) -> Curve:
    """``curve`` with each point's times no higher than those of the same point (TP degree, sequence
    length, recompute mode, live or shard-only, micro-batch) in ``others``.

    Why: a timing's error is added time, never removed time (a host stall, a one-off cost, the device
    waiting for the host at the start of the timed region), so where two timings of what must be the
    faster and the slower pass disagree, the faster one's figure is the one that holds the added time.
    On 4x H100 (2026-11-27, ``calibrate --sm-percent 100,50``) the whole GPU's first rows were timed at
    2.07 ms forward at micro-batch 1 where its 50 % share took 1.21 ms (the step traced 1.2 ms), and its
    live TP 2 forward at 2.68-2.82 ms where the share took 1.83-1.92 ms."""
    fwd, bwd = list(curve.fwd), list(curve.bwd)
    for o in others:
        if (o.tp, o.seq_len, o.recompute, o.collectives) != (curve.tp, curve.seq_len, curve.recompute,
                                                             curve.collectives):
            continue
        for j, mb in enumerate(curve.mbs):
            if mb in o.mbs:
                k = o.mbs.index(mb)
                fwd[j], bwd[j] = min(fwd[j], o.fwd[k]), min(bwd[j], o.bwd[k])
    return replace(curve, fwd=tuple(fwd), bwd=tuple(bwd))


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
            out[(c.tp, c.seq_len, c.recompute, c.collectives)] = replace(
                c, fwd=tuple(new[ci][0]), bwd=tuple(new[ci][1]))
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

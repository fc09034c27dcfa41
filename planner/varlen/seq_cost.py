"""Cost and memory of sequences of any length on the stages and pipelines of a plan.

**Per stage, per micro-batch** (forward + backward, TP all-reduces and the p2p sends included)::

    t(mb) = max(floor,  a·Σ s_d²  +  b·Σ s_d  +  c  +  d·n)      n documents of lengths s_d in one micro-batch

``a`` is attention's score and value work (quadratic in each document's length: packed documents
never attend across boundaries), ``b`` everything per token (GEMMs, norms, all-reduce and p2p
bytes), ``c`` what a micro-batch costs whatever its size (autocast's weight casts, the link's
latency), ``d`` what each document costs the packed attention (measured only: this host's packed
rows, :mod:`planner.calibration.packed`; 0 without them), ``floor`` the host's launch floor (eager
PyTorch is host- or GPU-bound: a small micro-batch costs what issuing its kernels does).
:func:`stage_cost` fits them to the cost model's own figures for micro-batches of ``m`` documents of
``s`` tokens (:func:`fit_points`: single documents on a geometric grid up to the context, and
micro-batches of 1-4 contexts of short documents), ``(a, b, c)`` by non-negative least squares on
relative errors over the points above the floor: the spec roofline, or the measured profile of a GPU
type where ``planner/profiles/devices/<type>-measured.json`` exists (timed by ``hexiscale profile``,
which runs the executor's layers). The worst relative error of the fit is kept with it.

**Memory**: a stage's peak grows linearly with the tokens of the micro-batches it holds (flash and
varlen attention keep no ``s²`` term), so ``token_cap`` is the largest micro-batch, in tokens,
that fits every device of the stage while 1F1B keeps ``S - i`` micro-batches in flight (GPipe
pipelines hold all of them: ``share_cap`` bounds the pipeline's tokens of one step instead).

**Per pipeline** (:class:`PipelineCost`), micro-batches ``j`` of stage times ``t_i(j)``: the
schedule's closed form, generalised to unequal micro-batches::

    T = Σ_j max_i t_i(j)  +  Σ_i t_i(ĵ) − max_i t_i(ĵ)        ĵ = the largest micro-batch

(the steady state paced by the bottleneck stage, plus one fill and drain of the pipeline; with
equal micro-batches it is :func:`planner.cost.schedule.one_f_one_b_time`), plus the stages'
cast-once weight copies, made once per step in each stage's first forward (:func:`stage_copies`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from planner.calibration.packed import fit_terms, packed_fit
from planner.cluster import ClusterSpec, Device
from planner.cost import ProfileSet, activation_bytes, boundary_time, stage_memory, stage_time
from planner.cost.memory import GIB
from planner.model import ModelSpec
from planner.plan import Pipeline, Plan

MIN_FIT_TOKENS = 128
FLOOR_MARGIN = 0.05  # points within 5 % of the smallest micro-batch's time count as on its floor


@dataclass(frozen=True)
class SeqCost:
    """``t = a·Σs² + b·Σs + c + d·n`` seconds per micro-batch of ``n`` documents; ``fit_error``: worst
    relative error."""

    a: float
    b: float
    c: float
    fit_error: float = 0.0
    packed_measured: bool = False  # the layers priced from this host's packed rows (planner.calibration.packed)
    d: float = 0.0  # per document packed into the micro-batch
    floor: float = 0.0  # no micro-batch costs less (the host's launch floor: :func:`fit_points_cost`)

    def sequence_s(self, s: float) -> float:
        """One sequence of ``s`` tokens (its per-document cost included), without the per-micro-batch
        constant."""
        return self.a * s * s + self.b * s + self.d

    def micro_batch_s(self, lengths: Sequence[int]) -> float:
        return max(self.floor,
                   self.a * sum(x * x for x in lengths) + self.b * sum(lengths) + self.c + self.d * len(lengths))


def fit_seq_cost(lengths: Sequence[int], seconds: Sequence[float], measured: bool = False,
                 per_document: float = 0.0) -> SeqCost:
    """Non-negative ``(a, b, c)`` minimising the relative squared error over the samples (one document
    of ``lengths[i]`` tokens each, its ``per_document`` cost taken out first and kept as ``d``)."""
    return fit_points_cost([(1, x) for x in lengths], seconds, measured, per_document)


def fit_points_cost(points: Sequence[tuple[int, int]], seconds: Sequence[float], measured: bool = False,
                    per_document: float = 0.0) -> SeqCost:
    """:func:`fit_seq_cost` over micro-batches of ``m`` documents of ``s`` tokens, ``points[i] = (m, s)``:
    ``t = max(floor, a·m·s² + b·m·s + c + m·per_document)``, as eager PyTorch is host- or GPU-bound
    (:mod:`planner.cost.profile`): ``floor`` is the smallest micro-batch's time and ``(a, b, c)`` are
    fitted to the points above it (by more than :data:`FLOOR_MARGIN`; all points where fewer than 3
    are). A line through floored points puts the floor in ``c`` and ``a·s²`` with ``b = 0``."""
    floor = min(seconds)
    above = [i for i, t in enumerate(seconds) if t > floor * (1 + FLOOR_MARGIN)]
    use = above if len(above) >= 3 else list(range(len(points)))
    ms, ss = [points[i][0] for i in use], [points[i][1] for i in use]
    (a, b, c), _ = fit_terms([[m * s * s for m, s in zip(ms, ss)], [m * s for m, s in zip(ms, ss)], [1.0] * len(use)],
                             [seconds[i] - m * per_document for i, m in zip(use, ms)])
    cost = SeqCost(a, b, c, 0.0, measured, per_document, floor)
    err = max(abs(cost.micro_batch_s([s] * m) / t - 1.0) for (m, s), t in zip(points, seconds))
    return replace(cost, fit_error=err)


def fit_grid(context: int, points: int = 12) -> list[int]:
    lo = min(MIN_FIT_TOKENS, context)
    return sorted({int(round(lo * (context / lo) ** (i / (points - 1)))) for i in range(points)})


def fit_points(context: int) -> list[tuple[int, int]]:
    """The micro-batches ``(m documents, s tokens each)`` a stage's cost is fitted on: one document of
    every ``s`` of :func:`fit_grid`, and (every other ``s``) as many ``s``-token documents as fill 1, 2
    and 4 contexts. The second kind is what a packed micro-batch is: many short documents under one
    host floor, past it. Fitted on single documents alone, the floor (a short sequence's layer is
    launch-bound: its time is flat in ``s``) went into ``c`` and ``a·s²`` with ``b = 0``, and 16
    documents of 256 tokens were priced 21 % under the profile's own figure for the same micro-batch
    (llama-1.3b at context 2048, one H100 stage of 24 layers; now +2 %)."""
    grid = fit_grid(context)
    many = [(k * context // s, s) for s in grid[::2] for k in (1, 2, 4)]
    return [(1, s) for s in grid] + [(m, s) for m, s in many if m > 1]


def stage_cost(model: ModelSpec, cluster: ClusterSpec, pipe: Pipeline, si: int, *, context: int, dtype: str,
               recompute: str, profiles: ProfileSet) -> SeqCost:
    """The fitted per-micro-batch cost of stage ``si`` of ``pipe`` (module docstring)."""
    st = pipe.stages[si]
    n = len(pipe.stages)
    devs = [cluster.device(d) for d in st.devices]
    times = []
    points = fit_points(context)
    measured = _packed_layers(model, devs, profiles, tp=st.tp, dtype=dtype, recompute=recompute, context=context)
    for m, s in points:
        tt = stage_time(model, layers=st.num_layers, first=si == 0, last=si == n - 1, micro_batch=m, tp=st.tp,
                        devices=[(profiles.get(d.gpu), d.slowdown) for d in devs],
                        tp_link=cluster.slowest_link(st.devices), dtype=dtype, recompute=recompute,
                        params=profiles.params, seq_len=s)
        nbytes = activation_bytes(model, m, dtype, seq_len=s, params=profiles.params)
        p2p = 0.0
        if si < n - 1:
            p2p += boundary_time(nbytes, st.devices, pipe.stages[si + 1].devices, cluster, profiles.params)
        if si > 0:
            p2p += boundary_time(nbytes, st.devices, pipe.stages[si - 1].devices, cluster, profiles.params)
        extra = st.num_layers * measured.extra(m, s) if measured is not None else 0.0
        times.append(tt.forward_s + tt.backward_s + p2p + extra)
    if measured is None:
        return fit_points_cost(points, times)
    return fit_points_cost(points, times, True, st.num_layers * measured.per_document)


def stage_copies(model: ModelSpec, cluster: ClusterSpec, pipe: Pipeline, *, context: int, dtype: str,
                 recompute: str, profiles: ProfileSet) -> float:
    """What the step's cast-once weight copies add to ``pipe`` (``StageTime.copy_s``, at one
    ``context``-token sequence): each stage makes them in its first forward, which the next stage
    waits for, so they add up along the pipeline's fill (as :func:`planner.cost.estimate` simulates)."""
    n = len(pipe.stages)
    total = 0.0
    for si, st in enumerate(pipe.stages):
        devs = [cluster.device(d) for d in st.devices]
        total += stage_time(model, layers=st.num_layers, first=si == 0, last=si == n - 1, micro_batch=1, tp=st.tp,
                            devices=[(profiles.get(d.gpu), d.slowdown) for d in devs],
                            tp_link=cluster.slowest_link(st.devices), dtype=dtype, recompute=recompute,
                            params=profiles.params, seq_len=context).copy_s
    return total


@dataclass(frozen=True)
class PackedLayers:
    """One layer of a stage priced from this host's packed rows (:func:`_packed_layers`)."""

    extra: Callable[[int, int], float]  # (m, s) -> beyond the profile's figure, m s-token documents, per_document in
    per_document: float  # seconds each document adds


def _packed_layers(model: ModelSpec, devs: Sequence[Device], profiles: ProfileSet, *, tp: int, dtype: str,
                   recompute: str, context: int) -> PackedLayers | None:
    """Where the stage's slowest GPU type has measured packed rows for ``model``'s layer
    (:func:`planner.calibration.packed.packed_fit`): what one layer of ``m`` documents of ``s`` tokens
    costs beyond the profile's figure, ``(F · L_tp / L_1 - L_tp) · slowdown`` at ``(m, s)`` (``L`` the
    profile's layer at this TP degree and recompute mode and at TP 1 without: the measurement sets
    the level, the roofline carries it), and what each further document adds, ``d`` of the fit carried
    the same way (at ``context``). ``F`` is the fit alone (its ``c`` holds the rows' launch floor): a
    floor from the profile taken on each one-document figure bent the stage's fit (``b = 0``, the rest
    on ``a·s²``) and priced micro-batches of several documents ~30 % low. None where the GPU type has
    no such rows."""
    slowest = max(devs, key=lambda d: d.slowdown / profiles.get(d.gpu).device.peak(dtype))
    prof = profiles.get(slowest.gpu)
    fit = packed_fit(prof, model, dtype)
    if fit is None:
        return None

    def ratio(m: int, s: int) -> tuple[float, float]:
        here = prof.layer_time(model, m, tp, dtype, recompute, s).total_s
        return here, here / prof.layer_time(model, m, 1, dtype, "none", s).total_s

    per_doc = fit.d * ratio(1, context)[1] * slowest.slowdown

    def extra(m: int, s: int) -> float:
        here, r = ratio(m, s)
        return (fit.seconds([s] * m) * r - here) * slowest.slowdown

    return PackedLayers(extra, per_doc)


def stage_token_cap(model: ModelSpec, cluster: ClusterSpec, pipe: Pipeline, si: int, *, in_flight: int, dtype: str,
                    recompute: str, zero_shards: int, profiles: ProfileSet,
                    resident: dict[str, float] | None = None) -> int:
    """Largest micro-batch (tokens) whose ``in_flight`` copies fit every device of the stage.

    ``resident`` (bytes per device): memory another layout keeps there — a working layout of hot
    switching holds no optimizer state of its own, its devices hold the home layout's weights,
    gradients and optimizer state (:func:`resident_bytes`)."""
    st = pipe.stages[si]
    n = len(pipe.stages)
    params = profiles.params_for(cluster.device(st.devices[0]).gpu)  # a stage's devices share a node
    frag = 1 + params.fragmentation

    def need(tokens: int) -> tuple[float, float]:
        """(the schedule's peak, linear in ``tokens``; the device's peak, which ZeRO-1's end of the
        backward may hold at a floor independent of ``tokens``)."""
        mem = stage_memory(model, layers=st.num_layers, tp=st.tp, first=si == 0, last=si == n - 1, micro_batch=1,
                           in_flight=in_flight, dtype=dtype, recompute=recompute, zero_shards=zero_shards,
                           params=params, seq_len=tokens)
        own = mem.required - (mem.optimizer * frag if resident is not None else 0.0)
        own += params.comm_gib * GIB
        return own - mem.step_buffers * frag, own
    (base, peak), step = need(1), 4096
    slope = (need(1 + step)[0] - base) / step
    have = min(cluster.device(d).memory_gib * GIB - (resident or {}).get(d, 0.0) for d in st.devices)
    room = have - base
    if room < 0 or have < peak:
        return 0
    hi = 1 + int(room / slope) if slope > 0 else 1 << 40
    if need(hi)[0] <= have:
        return hi
    # memory is convex in tokens, not linear, where a term is a max (full recompute's transient:
    # :func:`planner.cost.memory.full_recompute_transient`), so the line from small micro-batches
    # over-shoots: the largest fitting size lies below ``hi``
    lo = 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if need(mid)[0] <= have else (lo, mid)
    return lo


@dataclass(frozen=True)
class PipelineCost:
    """Cost model of one pipeline for packed micro-batches (module docstring)."""

    stages: tuple[SeqCost, ...]
    token_cap: int  # tokens per micro-batch (memory)
    share_cap: float  # tokens of one step (GPipe holds every micro-batch; 1F1B: unbounded)
    schedule: str = "1f1b"
    copies_s: float = 0.0  # the stages' cast-once weight copies, once per step (:func:`stage_copies`)

    def stage_times(self, lengths: Sequence[int]) -> list[float]:
        return [c.micro_batch_s(lengths) for c in self.stages]

    def bottleneck(self) -> SeqCost:
        """The stage with the largest per-token cost (what paces the steady state)."""
        return max(self.stages, key=lambda c: (c.b, c.a, c.c))

    def time(self, micro_batches: Sequence[Sequence[int]]) -> float:
        """Closed-form schedule time of these micro-batches (lists of sequence lengths)."""
        mbs = [m for m in micro_batches if m]
        if not mbs:
            return 0.0
        per = [self.stage_times(m) for m in mbs]
        big = max(range(len(mbs)), key=lambda j: sum(mbs[j]))
        return sum(max(t) for t in per) + sum(per[big]) - max(per[big]) + self.copies_s


def resident_bytes(plan: Plan, profiles: ProfileSet) -> dict[str, float]:
    """Per device of ``plan``: its fp32 weights, gradients and optimizer state (with ZeRO-1's
    sharding and the allocator's fragmentation) — what the home layout keeps during a step."""
    frag = 1 + profiles.params.fragmentation
    shards = len(plan.pipelines) if plan.options.zero == 1 else 1
    out = {}
    for pipe in plan.pipelines:
        for si, st in enumerate(pipe.stages):
            mem = stage_memory(plan.model, layers=st.num_layers, tp=st.tp, first=si == 0,
                               last=si == len(pipe.stages) - 1, micro_batch=1, in_flight=0, dtype=plan.options.dtype,
                               recompute=plan.options.recompute, zero_shards=shards, params=profiles.params, seq_len=1)
            for d in st.devices:
                out[d] = (mem.weights + mem.gradients + mem.optimizer) * frag
    return out


def pipeline_costs(plan: Plan, cluster: ClusterSpec, *, context: int | None = None,
                   profiles: ProfileSet | None = None, home: Plan | None = None) -> list[PipelineCost]:
    """The :class:`PipelineCost` of every pipeline of ``plan`` for sequences up to ``context``
    (default: the plan's ``seq_len``). With ``home`` (another plan of the pool), ``plan`` is a
    working layout: its token caps leave room for the home layout's resident state."""
    profiles = (profiles or ProfileSet(cluster.catalog)).for_options(plan.options)
    o = plan.options
    ctx = context or plan.model.seq_len
    zero_shards = len(plan.pipelines) if o.zero == 1 else 1
    resident = resident_bytes(home, profiles) if home is not None and home != plan else None
    out = []
    for pipe in plan.pipelines:
        n = len(pipe.stages)
        costs = tuple(stage_cost(plan.model, cluster, pipe, si, context=ctx, dtype=o.dtype, recompute=o.recompute,
                                 profiles=profiles) for si in range(n))
        gpipe = pipe.schedule == "gpipe"
        caps = [stage_token_cap(plan.model, cluster, pipe, si, in_flight=1 if gpipe else n - si, dtype=o.dtype,
                                recompute=o.recompute, zero_shards=zero_shards, profiles=profiles, resident=resident)
                for si in range(n)]
        cap = min(caps)
        copies = stage_copies(plan.model, cluster, pipe, context=ctx, dtype=o.dtype, recompute=o.recompute,
                              profiles=profiles)
        out.append(PipelineCost(costs, cap, cap if gpipe else math.inf, pipe.schedule, copies))
    return out

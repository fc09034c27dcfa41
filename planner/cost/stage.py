"""Per-stage time of one micro-batch: compute on the slowest device of the TP group plus the
tensor-parallel all-reduces, and the p2p time between two stages. Fast: no plan object.

Compute (forward; the backward likewise)::

    compute_f = max over the stage's devices d of  slowdown_d · (n · layer_f + [first] embed_f + [last] head_f)

TP all-reduces (Megatron tensor parallelism without sequence parallelism, as executor/parallel/tp_layers.py
does it), over the stage's TP group (flat, over the slowest link the group crosses); ``e``
compute bytes, ``r`` residual bytes (``Numerics``)::

    forward   2 per layer of T·h·e (outputs of wo and w_down) + [first] 1 of T·h·r (embedding)
              + [last] 2 of T·4 and T·8 bytes (cross-entropy max; sum-exp with target logit)
    backward  2 per layer of T·h·r (input gradients of the q/k/v and gate/up column-parallel
              linears) + [full recompute] 1 per layer of T·h·e (the wo all-reduce, recomputed; the
              checkpoint stops before w_down's) + [last] 1 of T·h·r (LM-head input gradient)

TP communication is not overlapped with compute (Megatron's default without sequence
parallelism): each all-reduce waits for the kernels before it and the kernels after it wait for
it. It loads both sides of eager execution, so a pass is composed from its GPU and host shares
(``DeviceProfile.pass_split``: a measured pass ``T`` is GPU time when it exceeds the host time of
its kernels, else a launch-bound figure — host time — and never compute to be scaled)::

    compute   = Σ_parts max(slowdown · G_part, H_part)              what the profile times
    comm_gpu  = Σ_collectives (allreduce(bytes) + copy)
    comm_host = Σ_collectives (collective_host_s + host_overhead of the copy)
    pass      = max(compute + comm_gpu, Σ_parts H_part + comm_host);   TP time = pass - compute

``copy`` is the local copy each all-reduce makes first (``contiguous().clone()`` in
executor/parallel/tp_layers.py: ``kernel_overhead_s + 2·bytes / bandwidth`` on the slowest device of the
group). A GPU-bound pass gets its all-reduces on top, as before; a launch-bound pass gets the
host's cost of issuing them when that is the larger: its host is the bottleneck, and the
collectives are host work too. The all-reduces' GPU time is not taken as hidden in a launch-bound
pass's idle GPU share: each one holds the kernels after it until the slower TP rank's host has
issued it (on 4 x H200, TP 4 at micro-batch 4 measured compute + all-reduces, and launch-bound TP 2
passes more, never less). ``slowdown`` (a slowed GPU, cluster overrides) scales the GPU share only:
issuing kernels does not get slower with the GPU.

Layers measured live (a measured profile's rows with ``collectives``: the layer timed on ``tp``
ranks with its real all-reduces, :mod:`planner.cost.measured` rule 6) already hold their own
collectives, GPU and host side: for a device whose profile says so
(``DeviceProfile.layer_holds_collectives``) the 2 forward and 2 backward all-reduces per layer
are left out of ``comm_gpu`` and ``comm_host`` (:func:`tp_collectives` with ``in_layer_time``); the
embedding's, the head's and full recompute's repeated one stay (the live rows time none of them).
The live figure is then the layer pass (GPU share ``T`` where ``T`` exceeds the kernels' host
time), so a ``slowdown`` scales its all-reduce waits too. Profiles without live rows (all from
before them) are composed exactly as above.

P2P between stage ``i`` and ``i+1`` (any TP degrees), one activation (or gradient) of ``T·h·r``
bytes, replicated on every TP rank of both stages (executor/parallel/p2p.py): the sending stage's leader
sends to the receiving stage's leader, which broadcasts it inside its TP group::

    boundary = p2p(link between the leaders) + broadcast(receiving TP group)

Cast-once weight copies (executor/model/cast_once.py): each layer, and the head, makes its
compute-dtype copy once per step, in the first forward that uses it (``DeviceProfile.weight_copy``:
GPU ``c`` and host ``k`` seconds per part). That forward is the step's first micro-batch's, priced
as the pass above with ``max(slowdown · (G_part + c_part), H_part + k_part)`` per part;
``StageTime.copy_s`` is what it adds to ``forward_s`` (:mod:`planner.cost.step` adds it to that one
micro-batch), so a launch-bound forward hides the copy in its idle GPU time and a GPU-bound one pays
it whole. Under autocast's path (``CostParams.cast_once`` off, or tables timed on it) every pass
casts instead, and ``copy_s`` is 0.

Context parallelism (``cp > 1``, :mod:`planner.cost.context`): every term above at ``seq_len / cp``
tokens, plus the balanced chunks' extra attention (GPU work) and the CP collectives of K,V, added
after the TP collectives and overlapped with nothing; a boundary's activation is split over the
CP slots (:func:`slots_boundary_time`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.cluster import ClusterSpec, Link
from planner.cost.context import cp_attention_extra, cp_comm_time, cp_slots, local_seq
from planner.cost.links import allreduce_time, group_broadcast_time, p2p_time
from planner.cost.ops import DTYPE_BYTES, Numerics
from planner.cost.params import DEFAULT_PARAMS, CostParams
from planner.cost.profile import DeviceProfile, PassTime
from planner.model import ModelSpec


@dataclass(frozen=True)
class StageTime:
    """Seconds per micro-batch. ``slowest`` is the index (in the stage's device list) of the device
    whose compute sets the stage's pace."""

    forward_compute_s: float
    backward_compute_s: float
    forward_tp_s: float
    backward_tp_s: float
    slowest: int = 0
    forward_cp_s: float = 0.0  # the CP all-gathers of K,V (planner.cost.context), exposed
    backward_cp_s: float = 0.0  # the CP reduce-scatters of dK,dV
    copy_s: float = 0.0  # what the step's first forward adds: the cast-once weight copies (module docstring)

    @property
    def forward_s(self) -> float:
        return self.forward_compute_s + self.forward_tp_s + self.forward_cp_s

    @property
    def backward_s(self) -> float:
        return self.backward_compute_s + self.backward_tp_s + self.backward_cp_s


def device_compute(model: ModelSpec, profile: DeviceProfile, *, layers: int, first: bool, last: bool,
                   micro_batch: int, tp: int, dtype: str, recompute: str,
                   seq_len: int | None = None) -> tuple[float, float]:
    """(forward, backward) compute seconds of one micro-batch on one device at nominal speed."""
    lt = profile.layer_time(model, micro_batch, tp, dtype, recompute, seq_len)
    f, b = layers * lt.forward_s, layers * lt.backward_s
    if first:
        et = profile.embedding_time(model, micro_batch, tp, dtype, seq_len)
        f, b = f + et.forward_s, b + et.backward_s
    if last:
        ht = profile.head_time(model, micro_batch, tp, dtype, seq_len)
        f, b = f + ht.forward_s, b + ht.backward_s  # the head is not checkpointed, even under full recompute
    return f, b


def tp_collectives(model: ModelSpec, *, layers: int, first: bool, last: bool, micro_batch: int, dtype: str,
                   recompute: str, params: CostParams = DEFAULT_PARAMS, seq_len: int | None = None,
                   in_layer_time: bool = False) -> tuple[list[float], list[float]]:
    """Bytes of every TP all-reduce of one micro-batch, (forward, backward) (module docstring).
    ``in_layer_time``: the layers' own 2 + 2 are inside the profile's layer time (live rows): left out."""
    tokens = micro_batch * (seq_len or model.seq_len)
    num = Numerics.from_params(dtype, params)
    act_e, act_r = float(tokens * model.hidden_size * num.e), float(tokens * model.hidden_size * num.r)
    own = 0 if in_layer_time else layers  # layers whose own all-reduces are counted here
    fwd = [act_e] * (2 * own)
    if first:
        fwd.append(act_r)  # the embedding's output is the residual stream
    if last:
        fwd += [tokens * 4.0, tokens * 8.0]  # cross-entropy: max, then (sum-exp, target logit)
    # full recompute repeats the attention's wo all-reduce but not w_down's (checkpoint early stop)
    bwd = [act_r] * (2 * own) + ([act_e] * layers if recompute == "full" else []) + ([act_r] if last else [])
    return fwd, bwd


def tp_comm_time(model: ModelSpec, *, layers: int, first: bool, last: bool, micro_batch: int, tp: int,
                 dtype: str, recompute: str, link: Link | None, params: CostParams = DEFAULT_PARAMS,
                 seq_len: int | None = None, in_layer_time: bool = False) -> tuple[float, float]:
    """(forward, backward) TP all-reduce seconds of one micro-batch over ``link`` (the network part;
    :func:`stage_time` adds the local copy each all-reduce makes)."""
    if tp <= 1 or link is None:
        return 0.0, 0.0
    fwd, bwd = tp_collectives(model, layers=layers, first=first, last=last, micro_batch=micro_batch, dtype=dtype,
                              recompute=recompute, params=params, seq_len=seq_len, in_layer_time=in_layer_time)
    return (sum(allreduce_time(x, tp, link, params) for x in fwd),
            sum(allreduce_time(x, tp, link, params) for x in bwd))


def stage_time(model: ModelSpec, *, layers: int, first: bool, last: bool, micro_batch: int, tp: int,
               devices: Sequence[tuple[DeviceProfile, float]], tp_link: Link | None, dtype: str = "bf16",
               recompute: str = "none", params: CostParams = DEFAULT_PARAMS,
               seq_len: int | None = None, cp: int = 1, cp_link: Link | None = None) -> StageTime:
    """Time of one micro-batch on a stage. ``devices`` lists (profile, slowdown) per device of the
    stage (identical devices may be passed once); ``tp_link`` is the slowest link inside its TP
    groups, ``cp_link`` inside its CP groups (``cp > 1``: :mod:`planner.cost.context`, every rank
    works on ``seq_len / cp`` tokens; its CP collectives are added after the TP ones, exposed)."""
    full_seq = seq_len
    if cp > 1:
        seq_len = local_seq(model, cp, seq_len)
    cgf, cgb, chf, chb = cp_comm_time(model, layers=layers, micro_batch=micro_batch, tp=tp, cp=cp, dtype=dtype,
                                      recompute=recompute, link=cp_link, params=params, seq_len=full_seq)
    comm: dict[bool, tuple[float, float, float, float]] = {}

    def collectives(in_layer_time: bool) -> tuple[float, float, float, float]:
        """The TP collectives' GPU and host seconds, forward and backward (module docstring)."""
        if in_layer_time not in comm:
            comm[in_layer_time] = tp_collective_time(
                model, layers=layers, first=first, last=last, micro_batch=micro_batch, tp=tp, devices=devices,
                tp_link=tp_link, dtype=dtype, recompute=recompute, params=params, seq_len=seq_len,
                in_layer_time=in_layer_time)
        return comm[in_layer_time]

    best = (-1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    slowest, first_forward = 0, 0.0
    cache: dict[int, list[tuple[int, PassTime, PassTime]]] = {}
    for i, (prof, slow) in enumerate(devices):
        gf, gb, hf, hb = collectives(tp > 1 and prof.layer_holds_collectives(model, micro_batch, tp, dtype, seq_len))
        parts = cache.get(id(prof))
        if parts is None:
            parts = cache[id(prof)] = device_split(model, prof, layers=layers, first=first, last=last,
                                                   micro_batch=micro_batch, tp=tp, dtype=dtype,
                                                   recompute=recompute, seq_len=seq_len)
            if cp > 1 and layers:  # the balanced chunks' extra attention: GPU work, no extra kernels
                extra = cp_attention_extra(model, prof, micro_batch=micro_batch, tp=tp, cp=cp, dtype=dtype,
                                           recompute=recompute, seq_len=full_seq)
                parts = cache[id(prof)] = [*parts, (layers, extra, PassTime(0.0, 0.0))]
        cf = sum(n * max(slow * g.forward_s, h.forward_s) for n, g, h in parts)
        cb = sum(n * max(slow * g.backward_s, h.backward_s) for n, g, h in parts)
        host_f, host_b = sum(n * h.forward_s for n, _, h in parts), sum(n * h.backward_s for n, _, h in parts)
        pf, pb = max(cf + gf, host_f + hf), max(cb + gb, host_b + hb)
        qf, qb = max(cf + gf + cgf, host_f + hf + chf), max(cb + gb + cgb, host_b + hb + chb)  # with CP's
        if qf + qb > best[0]:
            best, slowest = (qf + qb, cf, cb, pf - cf, pb - cb, qf - pf, qb - pb), i
        copies = device_copies(model, prof, layers=layers, first=first, last=last, tp=tp, dtype=dtype)
        copies += [(0.0, 0.0)] * (len(parts) - len(copies))  # (CP's extra attention copies nothing)
        if any(g for g, _ in copies):  # the forward of the step's first micro-batch, copies made in it
            cf1 = sum(n * max(slow * (g.forward_s + cg), h.forward_s + ch)
                      for (n, g, h), (cg, ch) in zip(parts, copies))
            host1 = host_f + sum(n * ch for (n, _, _), (_, ch) in zip(parts, copies))
            first_forward = max(first_forward, max(cf1 + gf + cgf, host1 + hf + chf))
    fwd = best[1] + best[3] + best[5]
    return StageTime(best[1], best[2], best[3], best[4], slowest, best[5], best[6], max(0.0, first_forward - fwd))


def tp_collective_time(model: ModelSpec, *, layers: int, first: bool, last: bool, micro_batch: int, tp: int,
                       devices: Sequence[tuple[DeviceProfile, float]], tp_link: Link | None, dtype: str,
                       recompute: str, params: CostParams, seq_len: int | None,
                       in_layer_time: bool) -> tuple[float, float, float, float]:
    """(GPU forward, GPU backward, host forward, host backward) seconds of the stage's TP collectives
    of one micro-batch: the all-reduces plus each one's local copy, and their issue cost on the host
    (module docstring); ``in_layer_time`` leaves the layers' own out (:func:`tp_collectives`)."""
    if tp <= 1 or tp_link is None:
        return 0.0, 0.0, 0.0, 0.0
    gf, gb = tp_comm_time(model, layers=layers, first=first, last=last, micro_batch=micro_batch, tp=tp,
                          dtype=dtype, recompute=recompute, link=tp_link, params=params, seq_len=seq_len,
                          in_layer_time=in_layer_time)
    fwd, bwd = tp_collectives(model, layers=layers, first=first, last=last, micro_batch=micro_batch,
                              dtype=dtype, recompute=recompute, params=params, seq_len=seq_len,
                              in_layer_time=in_layer_time)
    bw = min(p.device.memory_bandwidth_GBps / s for p, s in devices) * 1e9 * params.memory_efficiency
    gf += sum(params.kernel_overhead_s + 2 * x / bw for x in fwd)  # each first copies its buffer
    gb += sum(params.kernel_overhead_s + 2 * x / bw for x in bwd)
    hf = len(fwd) * (params.collective_host_s + params.host_overhead_s)
    hb = len(bwd) * (params.collective_host_s + params.host_overhead_backward_s)
    return gf, gb, hf, hb


def device_split(model: ModelSpec, profile: DeviceProfile, *, layers: int, first: bool, last: bool,
                 micro_batch: int, tp: int, dtype: str, recompute: str, seq_len: int | None = None
                 ) -> list[tuple[int, PassTime, PassTime]]:
    """``[(count, GPU, host)]`` of the passes one micro-batch makes on one device at nominal speed:
    the layers (``count = layers``), the embedding and the head (``DeviceProfile.pass_split``)."""
    out = []
    if layers:
        out.append((layers, *profile.pass_split("layer", model, micro_batch, tp, dtype, recompute, seq_len)))
    if first:
        out.append((1, *profile.pass_split("embedding", model, micro_batch, tp, dtype, "none", seq_len)))
    if last:  # the head is not checkpointed, even under full recompute
        out.append((1, *profile.pass_split("head", model, micro_batch, tp, dtype, "none", seq_len)))
    return out


def device_copies(model: ModelSpec, profile: DeviceProfile, *, layers: int, first: bool, last: bool, tp: int,
                  dtype: str) -> list[tuple[float, float]]:
    """(GPU, host) seconds of the cast-once weight copy of each of :func:`device_split`'s parts, in its
    order (per layer, none for the embedding, the head's): made in the step's first forward."""
    out = []
    if layers:
        out.append(profile.weight_copy("layer", model, tp, dtype))
    if first:
        out.append((0.0, 0.0))
    if last:
        out.append(profile.weight_copy("head", model, tp, dtype))
    return out


def activation_bytes(model: ModelSpec, micro_batch: int, dtype: str, seq_len: int | None = None,
                     params: CostParams = DEFAULT_PARAMS) -> float:
    """Bytes of one micro-batch's activation (or its gradient) at a stage boundary (residual dtype)."""
    r = 4 if params.fp32_residual else DTYPE_BYTES[dtype]
    return micro_batch * (seq_len or model.seq_len) * model.hidden_size * r


def boundary_time(nbytes: float, sender: Sequence[str], receiver: Sequence[str], cluster: ClusterSpec,
                  params: CostParams = DEFAULT_PARAMS) -> float:
    """Send ``nbytes`` replicated on the ``sender`` TP group to every rank of the ``receiver`` group:
    leader to leader, then a broadcast in the receiving group."""
    return p2p_time(nbytes, cluster.link(sender[0], receiver[0]), params) + group_broadcast_time(
        nbytes, receiver, cluster, params)


def slots_boundary_time(nbytes: float, sender: Sequence[str], sender_tp: int, receiver: Sequence[str],
                        receiver_tp: int, cluster: ClusterSpec, params: CostParams = DEFAULT_PARAMS) -> float:
    """:func:`boundary_time` between two stages that may be CP meshes: the activation is split over
    the CP slots, which send their parts at once, so each carries ``nbytes / min(cp)`` (priced on the
    first slots' leaders and the receiving first slot's TP group)."""
    a, b = cp_slots(sender, sender_tp), cp_slots(receiver, receiver_tp)
    return boundary_time(nbytes / min(len(a), len(b)), a[0], b[0], cluster, params)

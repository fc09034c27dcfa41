"""The whole-plan estimate: step time and its breakdown, throughput, MFU/HFU, memory, bottleneck.

Model of one training step (every term named; parameters in ``CostParams``):

1. Per pipeline ``p`` and stage ``i``, per micro-batch ``j`` (sizes from
   ``Pipeline.micro_batch_sizes``): ``f[i][j]``, ``b[i][j]`` = compute on the stage's slowest
   device (slowdown applied) + its TP all-reduces (:mod:`planner.cost.stage`) + its blocking p2p
   send to the next (forward) or previous (backward) stage.
2. The pipeline's schedule (any of :mod:`planner.schedules`) is evaluated by :func:`planner.cost.simulate.simulate`
   (exact for the model; the closed forms of :mod:`planner.cost.schedule` agree within their
   documented conditions): makespan ``T_p`` and when each stage ends its last backward, ``E_{p,i}``.
   The first micro-batch's forward ``f[i][0]`` also makes the stage's cast-once weight copies, once
   per step (``StageTime.copy_s``; executor/model/cast_once.py), so they delay the warm-up of every
   later stage as the engine's do.
3. Gradient sync across pipelines over the finest-common-slice groups
   (:mod:`planner.cost.gradsync`), in the executor's order: every device walks the groups in one
   global order (sorted by rank tuple); device ``d`` is free from ``E_{p,i} - dp_overlap·b[i][last]``
   (its stage's last backward end, less the part that may overlap it); group ``g`` (one owner per
   pipeline) runs when all its owners are free::

       end_g   = max_{d ∈ g} free_d + time_g ;  free_d = end_g for d ∈ g
       time_g  = all-reduce of the fp32 gradient bytes (ZeRO-1: the reduce-scatter half plus
                 the copies around it, :func:`zero_copy_time`)

   then each TP stage's leader broadcasts the reduced norm-scale gradients in its TP group.

   The executor (executor/train/engine.py, executor/parallel/grad_sync.py) launches each bucket's
   reduction from the backward hooks of the last micro-batch, yet ``dp_overlap = 0`` prices what a
   step measures: on 4x H200 (2026-11-27, llama-1.3b DP 4, traced steps) the sync left after the
   schedule took 2-6 ms on the bottleneck rank, but its backward ran 18 ms over the model's (the
   all-reduce: 21 ms; NCCL's kernels share the SMs and memory with the backward's), and the step
   came within 3.3 % of the estimate. Not yet separated: a TP 4 step without any sync ran its
   backward 28 ms over too.

4. ``sync_done = max(max_p T_p, max_d end_d)``; then the global gradient-norm all-reduce (one fp32
   scalar over every device, latency-bound), the optimizer step (clipping + AdamW, memory-bound,
   slowest device), and under ZeRO-1 the all-gather of the updated fp32 parameters (the other half
   of the all-reduce)::

       step = sync_done + grad_norm + max_d optimizer_d + zero_all_gather

   ZeRO-1's copies (executor/parallel/zero.py) are device-memory traffic on the critical path, counted with
   the collective they surround (``B`` a group's fp32 gradient bytes on each owner, ``k`` owners;
   read + write of each copy)::

       reduce side  6·B + 7·B/k   the owners' pieces read out of the gradients (cat) and padded,
                                  c10d's flattening of the k inputs of the list reduce-scatter,
                                  the output into the part, the master copy of the part, the
                                  norm's square and sum over the part
       gather side  4·B + 2·B/k   the part into the send buffer, c10d's unflattening of the
                                  all-gather's output list, the written-back parameter views

Context parallelism (``Stage.cp > 1``, :mod:`planner.cost.context`): stage times at ``S/cp``
tokens per rank plus the extra balanced attention and the CP collectives (``cp_comm_s``, exposed),
boundaries split over the CP slots, memory at ``S/cp`` plus the gathered K,V, each CP slot a
gradient owner (sync groups, ZeRO-1 shards over pipelines x cp), the norm broadcast per slot.

Breakdown (sums to ``step``; ``p*`` the slowest pipeline, ``k`` its bottleneck stage, i.e. the
stage with the largest busy time): compute, tp_comm, pp_comm = stage ``k``'s busy time split by
kind (tp_comm: its in-stage collectives, the CP ones included); bubble = ``T_p* -`` that busy
time; dp_sync = ``sync_done - T_p* +`` grad-norm + ZeRO all-gather; optimizer. ``idle_s`` of
pipeline ``p`` = ``sync_done - T_p`` (its wait at the sync).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from planner.cluster import ClusterSpec
from planner.cost.communicators import communicators
from planner.cost.compiled import compile_notes
from planner.cost.context import cp_groups, cp_slots, local_seq, slots_link
from planner.cost.cp_memory import cp_attention_memory
from planner.cost.gradsync import stage_owners, sync_groups
from planner.cost.links import allreduce_time, group_allreduce_time, group_broadcast_time
from planner.cost.memory import (
    GIB,
    ZERO_BUCKET_NUMEL,
    MemoryBreakdown,
    stage_memory,
    stage_params,
)
from planner.cost.partial_params import partial_params_table
from planner.cost.profile_set import ProfileSet
from planner.cost.schedule import held_with_grads, in_flight, split_backward_held
from planner.cost.sim_timeline import simulated_timeline, stage_lane
from planner.cost.simulate import simulate
from planner.cost.stage import StageTime, activation_bytes, slots_boundary_time, stage_time
from planner.errors import PlanInfeasible
from planner.layout import layer_numel, stage_tensors
from planner.plan import Plan
from planner.state_layout import zero_sharded
from planner.timeline import Lane, Timeline
from planner.validate import validate

BREAKDOWN_TERMS = ("compute", "tp_comm", "pp_comm", "bubble", "dp_sync", "optimizer")


@dataclass
class StageEstimate:
    devices: tuple[str, ...]
    slowest_device: str
    forward_s: float  # per micro-batch of the largest size, TP comm included, p2p excluded
    backward_s: float
    compute_s: float  # whole step (all micro-batches)
    tp_comm_s: float
    pp_comm_s: float
    busy_s: float
    last_backward_end_s: float
    cp_comm_s: float = 0.0  # the CP collectives of K,V (planner.cost.context); 0 without CP


@dataclass
class PipelineEstimate:
    time_s: float
    idle_s: float
    bottleneck_stage: int
    bubble_fraction: float
    stages: list[StageEstimate]


@dataclass
class Estimate:
    step_time_s: float
    tokens_per_s: float
    mfu: float
    hfu: float
    breakdown: dict[str, float]
    memory: dict[str, MemoryBreakdown]
    capacity_gib: dict[str, float]
    oom: list[dict[str, Any]]
    bottleneck: dict[str, Any]
    pipelines: list[PipelineEstimate]
    sources: dict[str, str] = field(default_factory=dict)
    calibration: dict[str, str] = field(default_factory=dict)  # GPU type -> where its cost terms come from
    timeline: Timeline | None = None  # estimate(..., timeline=True): the simulated step
    notes: list[str] = field(default_factory=list)  # what the user should know of how it was priced

    @property
    def memory_gib(self) -> dict[str, float]:
        return {d: m.total_gib for d, m in self.memory.items()}

    @property
    def fits(self) -> bool:
        return not self.oom

    def check_fits(self) -> None:
        """Raise ``PlanInfeasible`` naming the first device that runs out of memory."""
        if self.oom:
            o = self.oom[0]
            more = f" (and {len(self.oom) - 1} more devices)" if len(self.oom) > 1 else ""
            raise PlanInfeasible(o["path"], f"device {o['device']} needs {o['need_gib']:.2f} GiB but has "
                                 f"{o['capacity_gib']:.2f} GiB: {o['over_gib']:.2f} GiB over{more}",
                                 "use recompute, ZeRO-1, more micro-batches, more stages or a larger TP degree")

    def to_dict(self) -> dict[str, Any]:
        r = 6
        return {
            "step_time_s": round(self.step_time_s, r + 3),
            "tokens_per_s": round(self.tokens_per_s, 3),
            "mfu": round(self.mfu, r),
            "hfu": round(self.hfu, r),
            "breakdown": {k: round(v, r + 3) for k, v in self.breakdown.items()},
            "memory_gib": {d: round(v, 4) for d, v in self.memory_gib.items()},
            "memory_detail_gib": {d: {k: round(v, 4) for k, v in m.to_gib_dict().items()}
                                  for d, m in self.memory.items()},
            "oom": self.oom,
            "bottleneck": self.bottleneck,
            "pipelines": [{"time_s": round(p.time_s, r + 3), "idle_s": round(p.idle_s, r + 3),
                           "bottleneck_stage": p.bottleneck_stage, "bubble_fraction": round(p.bubble_fraction, r),
                           "stages": [{"devices": list(s.devices), "slowest_device": s.slowest_device,
                                       "forward_s": round(s.forward_s, r + 3), "backward_s": round(s.backward_s, r + 3),
                                       "compute_s": round(s.compute_s, r + 3), "tp_comm_s": round(s.tp_comm_s, r + 3),
                                       "pp_comm_s": round(s.pp_comm_s, r + 3),
                                       **({"cp_comm_s": round(s.cp_comm_s, r + 3)} if s.cp_comm_s else {})}
                                      for s in p.stages]}
                          for p in self.pipelines],
            "profile_sources": self.sources,
            "calibration": self.calibration,
            **({"notes": list(self.notes)} if self.notes else {}),
        }


def _pipeline(plan: Plan, pi: int, cluster: ClusterSpec, profiles: ProfileSet, record: bool = False
              ) -> tuple[PipelineEstimate, list[list[float]], list[Lane]]:
    """Simulate pipeline ``pi``; returns its estimate, per-stage backward times per micro-batch and
    (with ``record``) one timeline lane per stage."""
    pipe = plan.pipelines[pi]
    m, o, params = plan.model, plan.options, profiles.params
    sizes = pipe.micro_batch_sizes()
    n_st = len(pipe.stages)
    chunks = pipe.chunks
    times: dict[tuple[int, int], StageTime] = {}
    send_fwd: dict[tuple[int, int], float] = {}  # (stage i, mb): activation i -> i+1
    send_bwd: dict[tuple[int, int], float] = {}  # (stage i, mb): input gradient i -> i-1

    def timed(si: int, layers: int, first: bool, last: bool, mb: int) -> StageTime:
        st = pipe.stages[si]
        devs = [cluster.device(d) for d in st.devices]
        return stage_time(
            m, layers=layers, first=first, last=last, micro_batch=mb, tp=st.tp,
            devices=[(profiles.get(d.gpu), d.slowdown) for d in devs],
            tp_link=slots_link(cluster, cp_slots(st.devices, st.tp)), dtype=o.dtype, recompute=o.recompute,
            params=params, cp=st.cp, cp_link=slots_link(cluster, cp_groups(st.devices, st.tp)))

    for mb in sorted(set(sizes)):
        nbytes = activation_bytes(m, mb, o.dtype, params=params)
        for si, st in enumerate(pipe.stages):
            times[si, mb] = timed(si, st.num_layers, si == 0, si == n_st - 1, mb)
            nxt, prv = (pipe.stages[si + 1] if si < n_st - 1 else None), (pipe.stages[si - 1] if si > 0 else None)
            if chunks > 1:  # between chunks the last stage sends to the first, and the gradient comes back
                nxt, prv = nxt or pipe.stages[0], prv or pipe.stages[-1]
            send_fwd[si, mb] = (slots_boundary_time(nbytes, st.devices, st.tp, nxt.devices, nxt.tp, cluster, params)
                                if nxt is not None else 0.0)
            send_bwd[si, mb] = (slots_boundary_time(nbytes, st.devices, st.tp, prv.devices, prv.tp, cluster, params)
                                if prv is not None else 0.0)
    sends = ([[send_fwd[si, mb] for mb in sizes] for si in range(n_st)],
             [[send_bwd[si, mb] for mb in sizes] for si in range(n_st)])
    # the step's first forward on each stage makes its cast-once weight copies (planner.cost.stage)
    fc = [[times[si, mb].forward_s + (times[si, mb].copy_s if j == 0 else 0.0) for j, mb in enumerate(sizes)]
          for si in range(n_st)]
    if chunks > 1:  # every op that sends carries one whole send (planner.cost.simulate)
        f = fc
        b = [[times[si, mb].backward_s for mb in sizes] for si in range(n_st)]
    else:
        f = [[fc[si][j] + send_fwd[si, mb] for j, mb in enumerate(sizes)] for si in range(n_st)]
        b = [[times[si, mb].backward_s + send_bwd[si, mb] for mb in sizes] for si in range(n_st)]
    # A split backward's W: the weight-gradient GEMMs (dW = X^T dY) and their accumulation, the
    # roofline's share of the backward (:meth:`DeviceProfile.weight_grad_share`, ~0.28 for llama-1.3b
    # at 4K tokens; 4x H100 measured 0.31-0.36, benchmarks/results/bubbles_h100_20261127T042412Z.json).
    # Everything else of the backward is B, which the previous stage waits for. (Pricing W at the
    # forward's compute, as before, gave it the attention and element-wise work too: twice the measured W.)
    def w_share(si: int, mb: int) -> float:
        st = pipe.stages[si]
        return profiles.get(cluster.device(st.devices[0]).gpu).weight_grad_share(
            m, mb, st.tp, o.dtype, o.recompute, local_seq(m, st.cp))

    w = [[times[si, mb].backward_compute_s * w_share(si, mb) for mb in sizes] for si in range(n_st)]
    shares = None
    if chunks > 1:  # each chunk's part of its stage's compute: its layers, the embedding (first), the head (last)
        shares = []
        for si, st in enumerate(pipe.stages):
            parts = [timed(si, hi - lo, si == 0 and c == 0, si == n_st - 1 and c == chunks - 1, max(sizes))
                     for c, (lo, hi) in enumerate(st.chunks)]
            total = sum(t.forward_s + t.backward_s for t in parts)
            shares.append([(t.forward_s + t.backward_s) / total for t in parts])
    sim = simulate(f, b, len(sizes), pipe.schedule, record=record, wgrad=w, sends=sends if chunks > 1 else None,
                   chunks=chunks, shares=shares)
    # sends per micro-batch of each stage: one per virtual-stage boundary it feeds (v - 1 at the ends)
    n_fwd = [chunks - (chunks > 1 and si == n_st - 1) for si in range(n_st)]
    n_bwd = [chunks - (chunks > 1 and si == 0) for si in range(n_st)]
    lanes = [stage_lane(pi, si, sim.ops[si], fc[si],
                        [times[si, mb].backward_s for mb in sizes], w[si], chunks,
                        shares[si] if shares is not None else None, sim.op_chunks[si])
             for si in range(n_st)] if record else []
    stages = []
    for si, st in enumerate(pipe.stages):
        ts = [times[si, mb] for mb in sizes]
        big = times[si, max(sizes)]
        stages.append(StageEstimate(
            devices=st.devices, slowest_device=st.devices[big.slowest], forward_s=big.forward_s,
            backward_s=big.backward_s,
            compute_s=sum(t.forward_compute_s + t.backward_compute_s for t in ts) + ts[0].copy_s,
            tp_comm_s=sum(t.forward_tp_s + t.backward_tp_s for t in ts),
            cp_comm_s=sum(t.forward_cp_s + t.backward_cp_s for t in ts),
            pp_comm_s=sum(n_fwd[si] * send_fwd[si, mb] + n_bwd[si] * send_bwd[si, mb] for mb in sizes),
            busy_s=sim.busy[si],
            last_backward_end_s=sim.last_backward_end[si]))
    k = max(range(n_st), key=lambda i: sim.busy[i])
    bubble = 1.0 - sim.busy[k] / sim.makespan if sim.makespan > 0 else 0.0
    return PipelineEstimate(sim.makespan, 0.0, k, bubble, stages), b, lanes


def _gradient_sync(plan: Plan, cluster: ClusterSpec, profiles: ProfileSet, ready_end: dict[str, float],
                   last_bwd: dict[str, float], busy: dict[str, list[tuple[float, float]]] | None = None
                   ) -> tuple[dict[str, float], float]:
    """When each device finishes the cross-pipeline sync, as the executor runs it
    (executor/parallel/grad_sync.py): every device walks the sync groups in one global order (sorted by
    rank tuple); a group's all-reduce starts once all its owners are free and ends ``time_g`` later.
    Then every TP stage's leader broadcasts the reduced replicated gradients (norm scales) to its
    group. Returns ({device: end of its sync}, ZeRO-1 all-gather seconds after the step); ``busy``
    (if given) receives each device's (start, end) of every collective it takes part in."""
    busy = {} if busy is None else busy
    params, o = profiles.params, plan.options
    groups = sync_groups(plan)
    if not groups:
        return {}, 0.0
    rank = {r.device: r.rank for r in plan.ranks()}
    free = {d: ready_end[d] - params.dp_overlap * last_bwd[d] for d in ready_end}
    zero_ag = 0.0
    for owners in sorted(groups, key=lambda g: tuple(rank[d] for d in g)):
        t_g = group_allreduce_time(groups[owners], owners, cluster, params)
        if o.zero == 1:  # reduce-scatter now, all-gather of the updated fp32 parameters after the step
            bw = min(profiles.get(cluster.device(d).gpu).device.memory_bandwidth_GBps / cluster.device(d).slowdown
                     for d in owners) * 1e9 * params.memory_efficiency
            reduce_copy, gather_copy = zero_copy_time(groups[owners], len(owners), bw, params.kernel_overhead_s)
            zero_ag = max(zero_ag, 0.5 * t_g + gather_copy)
            t_g = 0.5 * t_g + reduce_copy
        end = max(free[d] for d in owners) + t_g
        for d in owners:
            free[d] = end
            busy.setdefault(d, []).append((end - t_g, end))
    replicated = layer_numel(plan.model)[1]
    final_norm = plan.model.hidden_size
    for pipe in plan.pipelines:
        for si, st in enumerate(pipe.stages):
            if st.tp > 1:
                nbytes = (replicated * st.num_layers + (final_norm if si == len(pipe.stages) - 1 else 0)) * 4.0
                for slot in cp_slots(st.devices, st.tp):  # one TP group per CP slot
                    t_b = group_broadcast_time(nbytes, slot, cluster, params)
                    end = max(free[d] for d in slot) + t_b
                    for d in slot:
                        free[d] = end
                        busy.setdefault(d, []).append((end - t_b, end))
    return free, zero_ag


ZERO_BUCKET_BYTES = 4.0 * ZERO_BUCKET_NUMEL  # one owner's share of one ZeRO-1 round


def zero_copy_time(nbytes: float, owners: int, bandwidth_Bps: float, kernel_s: float) -> tuple[float, float]:
    """(reduce side, gather side) seconds of ZeRO-1's copies for a group of ``nbytes`` fp32 gradient
    bytes per owner and ``owners`` owners, on a device copying at ``bandwidth_Bps`` (module
    docstring, step 4); every round (at most ``ZERO_BUCKET_NUMEL`` elements per owner) launches
    ``3k + 1`` copy kernels on the reduce side and ``k + 1`` on the gather side."""
    k = max(1, owners)
    if nbytes <= 0 or k == 1:
        return 0.0, 0.0
    rounds = math.ceil(nbytes / k / ZERO_BUCKET_BYTES)
    reduce_side = (6 * nbytes + 7 * nbytes / k) / bandwidth_Bps + rounds * (3 * k + 1) * kernel_s
    gather_side = (4 * nbytes + 2 * nbytes / k) / bandwidth_Bps + rounds * (k + 1) * kernel_s
    return reduce_side, gather_side


def estimate(plan: Plan, cluster: ClusterSpec, profiles: ProfileSet | None = None, *,
             timeline: bool = False) -> Estimate:
    """Estimate one training step of ``plan`` on ``cluster`` (see the module docstring); with
    ``timeline``, ``Estimate.timeline`` holds the simulated step stage by stage.

    Raises ``SpecError`` when the plan names devices the cluster lacks; running out of memory is
    reported in ``Estimate.oom`` (call ``check_fits()`` to turn it into an error)."""
    validate(plan, cluster)
    profiles = (profiles or ProfileSet(cluster.catalog)).for_options(plan.options)
    # the terms of links and collectives: the plan's own device types' (a device it leaves idle
    # cannot change them); device terms per type (profiles.params_for)
    profiles = profiles.narrowed({cluster.device(d).gpu for p in plan.pipelines for s in p.stages for d in s.devices})
    params, m, o = profiles.params, plan.model, plan.options
    n_pipes = len(plan.pipelines)
    owners = stage_owners(plan)  # gradient owners per stage: one per pipeline, one per CP slot

    pipes: list[PipelineEstimate] = []
    bwd_last: dict[str, float] = {}  # device -> its stage's last-micro-batch backward
    lbe: dict[str, float] = {}  # device -> end of its stage's last backward
    memory: dict[str, MemoryBreakdown] = {}
    capacity: dict[str, float] = {}
    oom: list[dict[str, Any]] = []
    optimizer: dict[str, float] = {}
    comms = communicators(plan)
    partial = partial_params_table(plan)
    lanes: list[Lane] = []
    for pi, pipe in enumerate(plan.pipelines):
        est, b, pipe_lanes = _pipeline(plan, pi, cluster, profiles, record=timeline)
        pipes.append(est)
        lanes += pipe_lanes
        mb = max(pipe.micro_batch_sizes())
        for si, st in enumerate(pipe.stages):
            first, last = si == 0, si == len(pipe.stages) - 1
            held = in_flight(pipe.schedule, len(pipe.stages), si, pipe.micro_batches, pipe.chunks)
            with_grads = held_with_grads(pipe.schedule, len(pipe.stages), si, pipe.micro_batches, pipe.chunks)
            moments = split_backward_held(pipe.schedule, len(pipe.stages), si, pipe.micro_batches, pipe.chunks)
            mems: dict[str, MemoryBreakdown] = {}
            # a CP stage: activations at S/cp per rank plus the gathered K,V; its slots are
            # gradient owners beside the pipelines (ZeRO-1, with two pipelines or more, shards over
            # pipelines x cp)
            seq = local_seq(m, st.cp) if st.cp > 1 else None
            shards = owners[pi][si] if zero_sharded(plan) else 1  # as the engine shards
            for gpu in {cluster.device(d).gpu for d in st.devices}:
                layer_act, head_act = profiles.get(gpu).stage_activations(
                    m, mb, st.tp, o.dtype, o.recompute, last=last, compile=o.compile, seq_len=seq)
                mems[gpu] = stage_memory(
                    m, layers=st.num_layers, tp=st.tp, first=first, last=last, micro_batch=mb, in_flight=held,
                    dtype=o.dtype, recompute=o.recompute, zero_shards=shards, params=profiles.params_for(gpu),
                    seq_len=seq, layer_activation=layer_act, head_activation=head_act,
                    held_with_grads=with_grads, pipelines=owners[pi][si], partial=partial[pi][si],
                    compile=o.compile, held=moments, cp_attention=cp_attention_memory(
                        m, micro_batch=mb, tp=st.tp, cp=st.cp, dtype=o.dtype, recompute=o.recompute,
                        params=profiles.params_for(gpu)))
            n_params = stage_params(m, st.num_layers, st.tp, first, last) / shards
            n_tensors = stage_tensors(m, st.num_layers, first, last)
            for di, dev_id in enumerate(st.devices):
                dev = cluster.device(dev_id)
                mem = mems[dev.gpu]
                comm = comms[dev_id] * profiles.params_for(dev.gpu).comm_gib * GIB
                mem = replace(mem, overhead=mem.overhead + comm)
                memory[dev_id] = mem
                capacity[dev_id] = dev.memory_gib
                if mem.required_gib > dev.memory_gib:
                    oom.append({"device": dev_id, "path": f"pipelines[{pi}].stages[{si}].devices[{di}]",
                                "need_gib": round(mem.required_gib, 3), "capacity_gib": dev.memory_gib,
                                "over_gib": round(mem.required_gib - dev.memory_gib, 3)})
                optimizer[dev_id] = profiles.get(dev.gpu).optimizer_time(n_params, n_tensors, o.dtype) * dev.slowdown
                bwd_last[dev_id] = b[si][-1]
                lbe[dev_id] = est.stages[si].last_backward_end_s

    # ---- cross-pipeline gradient sync (finest common slices) and the ZeRO-1 all-gather
    sync_busy: dict[str, list[tuple[float, float]]] = {}
    sync_end, zero_ag = _gradient_sync(plan, cluster, profiles, lbe, bwd_last, sync_busy)
    t_max = max(p.time_s for p in pipes)
    sync_done = max([t_max, *sync_end.values()])
    devices = plan.devices
    grad_norm = allreduce_time(4.0, len(devices), cluster.slowest_link(devices), params) if len(devices) > 1 else 0.0
    opt = max(optimizer.values())
    step = sync_done + grad_norm + max(optimizer.values()) + zero_ag
    for p in pipes:
        p.idle_s = sync_done - p.time_s

    # ---- breakdown on the slowest pipeline's bottleneck stage
    pstar = max(range(n_pipes), key=lambda i: pipes[i].time_s)
    pe = pipes[pstar]
    se = pe.stages[pe.bottleneck_stage]
    breakdown = {"compute": se.compute_s, "tp_comm": se.tp_comm_s + se.cp_comm_s, "pp_comm": se.pp_comm_s,
                 "bubble": pe.time_s - se.busy_s, "dp_sync": sync_done - pe.time_s + grad_norm + zero_ag,
                 "optimizer": opt}
    term = max(breakdown, key=lambda k: breakdown[k])
    device = se.slowest_device
    if term == "dp_sync" and sync_end:
        device = max(sync_end, key=lambda d: sync_end[d])
    elif term == "optimizer":
        device = max(optimizer, key=lambda d: optimizer[d])
    bottleneck = {"pipeline": pstar, "stage": pe.bottleneck_stage, "device": device, "term": term}

    tokens = plan.global_batch_size * m.seq_len
    tps = tokens / step
    peak = sum(profiles.get(cluster.device(d).gpu).peak_flops(o.dtype) for d in devices)
    sources = {cluster.device(d).gpu: profiles.get(cluster.device(d).gpu).source for d in devices}
    calibration = {gpu: profiles.terms_of(gpu) for gpu in sorted(sources)}
    steps = simulated_timeline(plan, lanes, sync_busy=sync_busy, sync_done=sync_done, grad_norm=grad_norm,
                               optimizer=optimizer, zero_all_gather=zero_ag) if timeline else None
    return Estimate(step_time_s=step, tokens_per_s=tps, mfu=tps * m.model_flops_per_token() / peak,
                    hfu=tps * m.hardware_flops_per_token(o.recompute) / peak, breakdown=breakdown, memory=memory,
                    capacity_gib=capacity, oom=oom, bottleneck=bottleneck, pipelines=pipes, sources=sources,
                    calibration=calibration, timeline=steps, notes=compile_notes(plan, cluster, profiles))

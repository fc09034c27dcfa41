"""HexiScale cost model: step time, memory, MFU and bottleneck of a plan on a cluster.

Whole plan (scores a candidate; ~ms)::

    from planner.cost import estimate, ProfileSet, CostParams
    est = estimate(plan, cluster)                     # -> Estimate
    est.step_time_s, est.tokens_per_s, est.mfu, est.hfu, est.breakdown, est.memory_gib, est.oom,
    est.bottleneck, est.pipelines; est.check_fits(); est.to_dict()  (JSON, for plan.estimate)
    estimate(plan, cluster, ProfileSet(cluster.catalog, CostParams(gemm_efficiency=0.7)))

Fast functions for the planner's inner loops (no plan object; results cached per argument tuple
where they touch profiles, plain arithmetic elsewhere). Stable signatures:

``ProfileSet(catalog=None, params=DEFAULT_PARAMS, prefer_measured=True).get(gpu) -> DeviceProfile``
    one profile per device type (measured table if the catalog entry has one, else spec roofline;
    the table format is documented in measured.py).
``DeviceProfile.layer_time(model, micro_batch, tp=1, dtype='bf16', recompute='none', seq_len=None) -> PassTime``
    one layer, one micro-batch, one TP shard, nominal speed: ``.forward_s``, ``.backward_s``
    (backward includes recompute). Also ``embedding_time``, ``head_time`` (same arguments without
    recompute), ``optimizer_time(num_params, num_tensors, dtype)``, ``peak_flops(dtype)``,
    ``activation_bytes(kind, model, micro_batch, tp, dtype, recompute)`` (measured bytes of a
    'layer' or the 'head' per micro-batch, None without a measurement: pass it to
    ``stage_memory(layer_activation=..., head_activation=...)``), ``explain_layer(...)`` (the
    roofline op by op).
``stage_time(model, *, layers, first, last, micro_batch, tp, devices, tp_link, dtype, recompute, params)``
    ``-> StageTime``; ``devices`` = [(DeviceProfile, slowdown), ...] of the TP group,
    per micro-batch: ``forward_s``/``backward_s`` = slowest device's compute + TP all-reduces
    and their local copies (split in ``forward_compute_s``, ``forward_tp_s``, ...); a launch-bound
    pass pays the host's cost of issuing the collectives (``collective_host_s``), a slowed device
    slows the GPU share of a pass only (``DeviceProfile.pass_split``: GPU and host seconds). Where
    ``DeviceProfile.layer_holds_collectives(...)`` (measured live TP rows) the layer time already
    holds the layer's own all-reduces, and they are not added again.
``device_compute(model, profile, *, layers, first, last, micro_batch, tp, dtype, recompute) -> (fwd, bwd)``
``tp_comm_time(model, *, layers, first, last, micro_batch, tp, dtype, recompute, link, params) -> (fwd, bwd)``
and ``tp_collectives(...) -> (fwd bytes list, bwd bytes list)``: the TP all-reduces themselves
(``in_layer_time=True``: without the layers' own, which live TP rows hold).
``boundary_time(nbytes, sender_devices, receiver_devices, cluster, params)`` and
``activation_bytes(model, micro_batch, dtype, params=...)``: p2p between two stages (TP-degree changes
included; pass ``params`` so the residual dtype follows ``CostParams.fp32_residual``).
``p2p_time, broadcast_time, allreduce_time, ring_allreduce_time, tree_allreduce_time,
reduce_scatter_time, all_gather_time, hierarchical_allreduce_time`` (nbytes, n, Link, params)
and ``group_allreduce_time(nbytes, devices, cluster, params)``: collectives from links.
``pipeline_time(f, b, m, schedule)``, ``one_f_one_b_time``, ``gpipe_time``,
``one_f_one_b_lower_bound``, ``bubble_fraction``: closed-form schedules from per-stage times
(p2p folded in with ``fold_p2p``); ``simulate(f, b, m, schedule, wgrad=None)`` for the exact
makespan of any schedule of :mod:`planner.schedules` (the ops the executor runs; ``wgrad`` the
weight-gradient part of ``b`` for a split backward). ``in_flight(schedule, stages, stage_index, m)``
(the registry's rule; an unknown name is a SpecError) and
``stage_memory(model, *, layers, tp, first, last, micro_batch, in_flight, dtype, recompute, zero_shards,
params, layer_activation=None, head_activation=None, held_with_grads=None, pipelines=1, partial=0.0,
compile=False, held=None) -> MemoryBreakdown`` (``compile``: the plan's blocks are compiled, whose layers keep
``compiled_layer_activation_bytes``; ``held``: a split backward's moments,
``split_backward_held(schedule, stages, stage_index, m)``, charged by wgrad_memory.py)
    with ``held_with_grads(schedule, stages, stage_index, m)`` for the exact peak and
    ``partial_params(plan, pipeline, stage)`` for shards cut into several sync slices (module
    partial_params.py) (bytes per term; ``.total_gib``: the device's peak, ``.required_gib`` the same, for
    out-of-memory checks); ``state_bytes(params, pipelines, zero_shards, partial)``: the
    parameters, gradients and optimizer state alone; ``stage_params(model, layers, tp, first, last)``.
``sync_groups(plan)``: cross-pipeline gradient groups (finest common slices) and their bytes.

Every tunable constant is a named physical term of ``CostParams`` (see params.py); the formulas
are documented in each module. The model follows the executor as it runs today (fp32 master
parameters with autocast, fp32 residual stream, leader-to-leader p2p plus broadcast, gradient
sync after the schedule); the ``CostParams`` switches ``fp32_residual``, ``autocast_weight_copies``,
``expand_kv_heads`` and ``dp_overlap`` describe those choices.

Modules: params (CostParams), ops (FLOPs/bytes per kernel), profile (spec roofline, ProfileSet),
measured (profiler tables), links (collectives), stage (per-stage time, p2p), memory, schedule
(closed forms), simulate (discrete-event schedule), gradsync (finest-common-slice groups), step
(the whole-plan estimate).

Checked against the executor itself (tests/planner/test_cost_memory_executor.py,
test_cost_executor_comm.py, test_cost_step.py): the activation bytes per layer and of the head
equal what autograd saves in ``executor.model.llama`` (fp32 and bf16 autocast, every recompute mode,
TP shard shapes); the TP all-reduces equal the ones ``executor.parallel.tp_layers`` issues; the gradient
sync groups equal ``planner.layout``'s. Times are the spec roofline until profiles are measured.
"""

from planner.cost.gradsync import sync_groups
from planner.cost.links import (
    all_gather_time,
    allreduce_time,
    broadcast_time,
    group_allreduce_time,
    group_broadcast_time,
    hierarchical_allreduce_time,
    p2p_time,
    reduce_scatter_time,
    ring_allreduce_time,
    tree_allreduce_time,
)
from planner.cost.measured import MeasuredProfile
from planner.cost.measured_tables import MEASURED_FORMAT, parse_measured
from planner.cost.memory import (
    GIB,
    MemoryBreakdown,
    StateBytes,
    compiled_layer_activation_bytes,
    layer_activation_bytes,
    stage_memory,
    stage_params,
    state_bytes,
    weight_copy_bytes,
)
from planner.cost.params import DEFAULT_PARAMS, CostParams
from planner.cost.partial_params import partial_params, partial_params_table
from planner.cost.profile import DeviceProfile, PassTime, SpecProfile
from planner.cost.profile_set import ProfileSet
from planner.cost.schedule import (
    bubble_fraction,
    gpipe_time,
    held_with_grads,
    in_flight,
    one_f_one_b_lower_bound,
    one_f_one_b_time,
    pipeline_time,
)
from planner.cost.simulate import SimResult, fold_p2p, simulate
from planner.cost.stage import (
    StageTime,
    activation_bytes,
    boundary_time,
    device_compute,
    stage_time,
    tp_collectives,
    tp_comm_time,
)
from planner.cost.step import BREAKDOWN_TERMS, Estimate, PipelineEstimate, StageEstimate, estimate

__all__ = [
    "BREAKDOWN_TERMS", "DEFAULT_PARAMS", "GIB", "MEASURED_FORMAT", "MeasuredProfile", "parse_measured",
    "CostParams", "DeviceProfile", "Estimate", "MemoryBreakdown", "StateBytes",
    "PassTime", "PipelineEstimate", "ProfileSet", "SimResult", "SpecProfile", "StageEstimate", "StageTime",
    "activation_bytes", "all_gather_time", "allreduce_time", "boundary_time", "broadcast_time", "bubble_fraction",
    "device_compute", "estimate", "fold_p2p", "gpipe_time", "group_allreduce_time", "group_broadcast_time",
    "compiled_layer_activation_bytes",
    "held_with_grads", "hierarchical_allreduce_time", "in_flight", "layer_activation_bytes", "one_f_one_b_lower_bound",
    "one_f_one_b_time", "p2p_time", "partial_params", "partial_params_table", "pipeline_time", "reduce_scatter_time",
    "ring_allreduce_time",
    "simulate", "stage_memory", "stage_params", "stage_time", "state_bytes", "sync_groups", "tp_collectives",
    "tp_comm_time", "tree_allreduce_time", "weight_copy_bytes",
]

"""Context parallelism (CP) of one stage: what ``cp`` ranks sharing each sequence cost.

A stage of ``cp > 1`` is a ``cp x tp`` mesh (:mod:`planner.plan`): ``cp`` slots, each a TP group
of ``tp`` consecutive devices; the devices with the same TP rank form that rank's CP group. Each
CP rank holds 2 causal-balanced chunks of the sequence (chunks ``r`` and ``2cp-1-r`` of ``2cp``),
``S/cp`` tokens, so every token-linear term (GEMMs, norms, TP all-reduces, the head) is the
stage's work at ``S/cp``: the profile is read at ``seq_len = S/cp``. (The loss's sum over the CP
ranks is one scalar all-reduce a micro-batch: latency only, not priced.)

Attention (per layer): each rank gathers K and V of the whole sequence (all-gather over its CP
group, forward) and its queries attend to them causally. The balanced chunks give every rank
``1/cp`` of the causal ``S²/2`` query-key pairs, while a layer at ``S/cp`` counts
``(S/cp)²/2``: the rank does ``cp - 1`` more attention cores at ``S/cp`` (forward, backward, and
the recompute of either mode, which repeats the attention core)::

    extra_f = cp · attention_core(S/cp) on the CP kernel − attention_core(S/cp)     roofline
    extra_b = the same with the backward's FLOPs (bwd ratio [+ 1 under recompute])

The CP kernel is the executor's blockwise path (:mod:`executor.parallel.cp_blockwise`: flash
pieces merged by log-sum-exp; the dense path runs cuDNN on Hopper): ``cp_attention_efficiency`` of
peak, which ``hexiscale calibrate`` measures on CUDA (:mod:`planner.calibration.cp_attention`).
A measured profile's layer keeps its attention core at the roofline too
(:mod:`planner.cost.measured`, rule 3), so the extra is not scaled by the table's level.

Communication per layer, over the slowest link of the stage's CP groups (the link model of
:mod:`planner.cost.links`), **overlapped with nothing** (the executor gathers K/V before the
attention and reduce-scatters dK/dV after its backward, in the stream of the compute)::

    forward   all-gather of K,V: 2 · b · S · kv / tp · e bytes (the gathered buffer)
    backward  the all-gather again (the node keeps only its own K,V) and the reduce-scatter of
              dK,dV (same bytes) [+ full or selective recompute: the forward's all-gather again]

Memory per rank: activations at ``S/cp`` plus the gathered (GQA-expanded) K,V the attention saves
and its gradient buffers at the backward's peak (:mod:`planner.cost.cp_memory`). Weights, gradients
and optimizer state are replicated over the ``cp`` slots; their gradients are summed like data
parallelism, so the CP slots are gradient owners beside the pipelines (ZeRO-1 shards over
``pipelines x cp`` owners).
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.cluster import ClusterSpec, Link
from planner.cost.links import all_gather_time
from planner.cost.ops import DTYPE_BYTES
from planner.cost.params import DEFAULT_PARAMS, CostParams
from planner.cost.profile import DeviceProfile, PassTime
from planner.model import ModelSpec


def cp_slots(devices: Sequence[str], tp: int) -> list[tuple[str, ...]]:
    """The TP groups of a stage, one per CP slot (slot ``k`` = devices ``k·tp .. k·tp + tp - 1``)."""
    return [tuple(devices[k:k + tp]) for k in range(0, len(devices), tp)]


def cp_groups(devices: Sequence[str], tp: int) -> list[tuple[str, ...]]:
    """The CP groups of a stage: per TP rank ``r``, the devices ``r, r + tp, r + 2·tp, ...``."""
    return [tuple(devices[r::tp]) for r in range(tp)]


def slots_link(cluster: ClusterSpec, groups: Sequence[Sequence[str]]) -> Link | None:
    """The slowest link inside any of ``groups`` (None when every group is one device)."""
    links = [lk for g in groups if (lk := cluster.slowest_link(tuple(g))) is not None]
    return min(links, key=lambda lk: (lk.bandwidth_GBps, -lk.latency_us)) if links else None


def local_seq(model: ModelSpec, cp: int, seq_len: int | None = None) -> int:
    """Tokens of one sequence on one CP rank."""
    return (seq_len or model.seq_len) // cp


def kv_bytes(model: ModelSpec, micro_batch: int, tp: int, dtype: str, seq_len: int | None = None) -> float:
    """K and V of one layer for the whole sequence on one TP rank (the gathered buffer)."""
    return 2.0 * micro_batch * (seq_len or model.seq_len) * model.kv_dim / tp * DTYPE_BYTES[dtype]


def cp_collectives(model: ModelSpec, *, layers: int, micro_batch: int, tp: int, cp: int, dtype: str,
                   recompute: str, seq_len: int | None = None) -> tuple[list[float], list[float]]:
    """Bytes (the whole gathered buffer) of every CP collective of one micro-batch, (forward, backward)."""
    if cp <= 1 or layers <= 0:
        return [], []
    kv = kv_bytes(model, micro_batch, tp, dtype, seq_len)
    return [kv] * layers, [kv] * layers * (3 if recompute in ("full", "selective") else 2)


def cp_comm_time(model: ModelSpec, *, layers: int, micro_batch: int, tp: int, cp: int, dtype: str,
                 recompute: str, link: Link | None, params: CostParams = DEFAULT_PARAMS,
                 seq_len: int | None = None) -> tuple[float, float, float, float]:
    """(GPU forward, GPU backward, host forward, host backward) seconds of the CP collectives of
    one micro-batch (module docstring); the host side is each collective's issue cost."""
    fwd, bwd = cp_collectives(model, layers=layers, micro_batch=micro_batch, tp=tp, cp=cp, dtype=dtype,
                              recompute=recompute, seq_len=seq_len)
    if not fwd or link is None:
        return 0.0, 0.0, 0.0, 0.0
    gf = sum(all_gather_time(x, cp, link, params) for x in fwd)
    gb = sum(all_gather_time(x, cp, link, params) for x in bwd)  # a reduce-scatter costs the same
    return (gf, gb, len(fwd) * (params.collective_host_s + params.host_overhead_s),
            len(bwd) * (params.collective_host_s + params.host_overhead_backward_s))


def cp_attention_extra(model: ModelSpec, profile: DeviceProfile, *, micro_batch: int, tp: int, cp: int,
                       dtype: str, recompute: str, seq_len: int | None = None) -> PassTime:
    """GPU seconds one CP rank's attention adds per layer beyond a plain layer at ``S/cp``
    (module docstring): its ``cp`` attention cores on the CP kernel (``cp_attention_efficiency``)
    less the one dense core the layer at ``S/cp`` already holds."""
    if cp <= 1:
        return PassTime(0.0, 0.0)
    s = local_seq(model, cp, seq_len)
    f_cp, b_cp = profile.attention_core_time(model, micro_batch, tp, dtype, recompute, s, copies=cp, cp_kernel=True)
    f_one, b_one = profile.attention_core_time(model, micro_batch, tp, dtype, recompute, s)
    return PassTime(max(0.0, f_cp - f_one), max(0.0, b_cp - b_one))

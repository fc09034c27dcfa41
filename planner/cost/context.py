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

    extra_f = (cp - 1) · attention_core(S/cp)                  roofline FLOPs and bytes
    extra_b = (cp - 1) · attention_core(S/cp) · (bwd ratio [+ 1 under recompute])

On a measured profile the extra is scaled by the measured/roofline ratio of the layer at
``S/cp`` (the table sets the level, the roofline the shape, as :mod:`planner.cost.measured` does).

Communication per layer, over the slowest link of the stage's CP groups (the link model of
:mod:`planner.cost.links`), **overlapped with nothing** (the executor gathers K/V before the
attention and reduce-scatters dK/dV after its backward, in the stream of the compute)::

    forward   all-gather of K,V: 2 · b · S · kv / tp · e bytes (the gathered buffer)
    backward  reduce-scatter of dK,dV (same bytes) [+ full recompute: the all-gather again]

Memory per rank: activations at ``S/cp`` plus the gathered (GQA-expanded) K,V the attention saves
and its gradient buffers at the backward's peak (:mod:`planner.cost.cp_memory`). Weights, gradients
and optimizer state are replicated over the ``cp`` slots; their gradients are summed like data
parallelism, so the CP slots are gradient owners beside the pipelines (ZeRO-1 shards over
``pipelines x cp`` owners).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from planner.cluster import ClusterSpec, Link
from planner.cost.links import all_gather_time
from planner.cost.ops import DTYPE_BYTES, attention_core_forward
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
    return [kv] * layers, [kv] * layers * (2 if recompute == "full" else 1)


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
    (module docstring): ``cp - 1`` more attention cores, scaled to the profile's level."""
    if cp <= 1:
        return PassTime(0.0, 0.0)
    s = local_seq(model, cp, seq_len)
    core = attention_core_forward(model, micro_batch, s, tp, DTYPE_BYTES[dtype])
    ratio = profile.params.attention_backward_flops_ratio
    fwd = profile.op_time(replace(core, flops=core.flops * (cp - 1), bytes=core.bytes * (cp - 1), kernels=0), dtype)
    bwd = profile.op_time(replace(core, flops=core.flops * (cp - 1) * ratio, bytes=2 * core.bytes * (cp - 1),
                                  kernels=0), dtype)
    if recompute in ("full", "selective"):
        bwd += fwd
    have = profile.layer_time(model, micro_batch, tp, dtype, "none", s)
    spec = profile._spec_layer(model, micro_batch, tp, dtype, "none", s)
    return PassTime(fwd * have.forward_s / spec.forward_s, bwd * have.backward_s / spec.backward_s)

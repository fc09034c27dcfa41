"""Cross-pipeline gradient synchronisation groups (finest common slices, :mod:`planner.layout`).

For each TP-sharded tensor (a layer's q/k/v/o/gate/up/down weights, the vocab-parallel
embedding and LM head), pipeline ``p`` holds it on a stage of TP degree ``t_p``. The finest common
layout (:func:`planner.layout.finest_slices`) cuts it into ``T = lcm_p t_p`` slices with one owner
per pipeline; each slice is all-reduced among its owners, so a device of a stage with ``t_p < T``
takes part in ``T / t_p`` groups. Replicated tensors (RMSNorm weights) are reduced once per
pipeline, among the TP-rank-0 devices. The groups equal :func:`planner.layout.build_topology`'s,
summed per owner set; layers are walked in segments between stage boundaries, not one by one.

A context-parallel stage (``cp > 1``) holds its weights in each of its ``cp`` slots (TP groups,
:mod:`planner.cost.context`), whose gradients are summed like data parallelism: every slot is a
holder of its own, so a plan of one pipeline with a CP stage has groups too.

Gradients are reduced in fp32 (4 bytes per element). This module only collects
``{owner-tuple: bytes}``; :mod:`planner.cost.step` turns them into time.
"""

from __future__ import annotations

from collections import defaultdict

from planner.cost.context import cp_slots
from planner.cost.ops import GRAD_BYTES
from planner.layout import embed_param, finest_slices, head_params, layer_numel
from planner.plan import Plan, uses_cp


def _owners(plan: Plan, layer: int, where: str) -> list[tuple[str, ...]]:
    """Per pipeline, per CP slot, the devices (TP group) holding ``layer`` (or the embedding/head)."""
    out = []
    for pipe in plan.pipelines:
        if where == "embed":
            st = pipe.stages[0]
        elif where == "head":
            st = pipe.stages[-1]
        else:
            st = next(s for s in pipe.stages if any(lo <= layer < hi for lo, hi in s.chunks))
        out += cp_slots(st.devices, st.tp)
    return out


def _add_sharded(groups: dict[tuple[str, ...], float], holders: list[tuple[str, ...]], elements: float) -> None:
    slices = finest_slices([len(h) for h in holders])
    for tp_ranks in slices:
        groups[tuple(h[r] for h, r in zip(holders, tp_ranks))] += elements / len(slices) * GRAD_BYTES


def sync_groups(plan: Plan) -> dict[tuple[str, ...], float]:
    """``{(owner in pipeline 0, owner in pipeline 1, ...): fp32 gradient bytes}`` (a CP stage gives
    one owner per slot); empty for one pipeline without CP (nothing to synchronise)."""
    groups: dict[tuple[str, ...], float] = defaultdict(float)
    if len(plan.pipelines) < 2 and not uses_cp(plan):
        return {}
    m = plan.model
    sharded, replicated = layer_numel(m)
    # layers with the same holders in every pipeline share one bucket: walk the layer boundaries
    cuts = sorted({0, m.num_layers} | {c[0] for p in plan.pipelines for s in p.stages for c in s.chunks})
    for lo, hi in zip(cuts, cuts[1:], strict=False):
        holders = _owners(plan, lo, "layer")
        _add_sharded(groups, holders, sharded * (hi - lo))
        groups[tuple(hd[0] for hd in holders)] += replicated * (hi - lo) * GRAD_BYTES
    _add_sharded(groups, _owners(plan, 0, "embed"), embed_param(m).numel)
    head = _owners(plan, 0, "head")
    for info in head_params(m):
        if info.shard_dim is None:
            groups[tuple(hd[0] for hd in head)] += info.numel * GRAD_BYTES
        else:
            _add_sharded(groups, head, info.numel)
    return dict(groups)


def stage_owners(plan: Plan) -> list[list[int]]:
    """Per pipeline and stage, the gradient owners of its first layer (``[pipeline][stage]``): one per
    CP slot of the stage holding that layer in every pipeline (the pipeline count without CP). What
    ZeRO-1 shards a stage's optimizer state over; stages whose later layers have other owners
    (other pipelines with other CP degrees there) are counted by their first layer."""
    cps = [[(c, s.cp) for s in p.stages for c in s.chunks] for p in plan.pipelines]

    def owners(layer: int) -> int:
        return sum(next(cp for (lo, hi), cp in pipe if lo <= layer < hi) for pipe in cps)

    memo: dict[int, int] = {}  # per first layer (not setdefault: it would count every stage again)
    for p in plan.pipelines:
        for s in p.stages:
            if s.layers[0] not in memo:
                memo[s.layers[0]] = owners(s.layers[0])
    return [[memo[s.layers[0]] for s in p.stages] for p in plan.pipelines]

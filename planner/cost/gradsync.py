"""Cross-pipeline gradient synchronisation groups (finest common slices, DESIGN.md).

For each TP-sharded tensor (a layer's q/k/v/o/gate/up/down weights, the vocab-parallel
embedding and LM head), pipeline ``p`` holds it on a stage of TP degree ``t_p``. The finest common
layout cuts it into ``T = lcm_p t_p`` slices; slice ``k`` is owned in pipeline ``p`` by TP rank
``k·t_p // T`` of that stage. Each slice is all-reduced among its owners (one device per
pipeline), so a device of a stage with ``t_p < T`` takes part in ``T / t_p`` groups.
Replicated tensors (RMSNorm weights) are reduced once per pipeline, among the TP-rank-0 devices.

Gradients are reduced in fp32 (4 bytes per element). This module only collects
``{owner-tuple: bytes}``; :mod:`planner.cost.step` turns them into time.
"""

from __future__ import annotations

import math
from collections import defaultdict

from planner.cost.ops import GRAD_BYTES
from planner.plan import Plan


def _owners(plan: Plan, layer: int, where: str) -> list[tuple[str, ...]]:
    """Per pipeline, the devices (TP group) holding ``layer`` (or the embedding/head)."""
    out = []
    for pipe in plan.pipelines:
        if where == "embed":
            out.append(pipe.stages[0].devices)
        elif where == "head":
            out.append(pipe.stages[-1].devices)
        else:
            out.append(next(s.devices for s in pipe.stages if s.layers[0] <= layer < s.layers[1]))
    return out


def _add_sharded(groups: dict[tuple[str, ...], float], holders: list[tuple[str, ...]], elements: float) -> None:
    finest = math.lcm(*(len(h) for h in holders))
    per_slice = elements / finest * GRAD_BYTES
    for k in range(finest):
        key = tuple(h[k * len(h) // finest] for h in holders)
        groups[key] += per_slice


def sync_groups(plan: Plan) -> dict[tuple[str, ...], float]:
    """``{(owner in pipeline 0, owner in pipeline 1, ...): fp32 gradient bytes}``; empty for one
    pipeline (nothing to synchronise)."""
    groups: dict[tuple[str, ...], float] = defaultdict(float)
    if len(plan.pipelines) < 2:
        return {}
    m = plan.model
    h = m.hidden_size
    sharded = m.layer_params() - 2 * h
    # layers with the same holders in every pipeline share one bucket: walk the layer boundaries
    cuts = sorted({0, m.num_layers} | {s.layers[0] for p in plan.pipelines for s in p.stages})
    for lo, hi in zip(cuts, cuts[1:], strict=False):
        holders = _owners(plan, lo, "layer")
        _add_sharded(groups, holders, sharded * (hi - lo))
        groups[tuple(hd[0] for hd in holders)] += 2 * h * (hi - lo) * GRAD_BYTES
    _add_sharded(groups, _owners(plan, 0, "embed"), m.embedding_params())
    head = _owners(plan, 0, "head")
    if not m.tie_embeddings:
        _add_sharded(groups, head, m.vocab_size * h)
    groups[tuple(hd[0] for hd in head)] += h * GRAD_BYTES
    return dict(groups)

"""Parameters whose local shard is cut into several sync slices (``X`` in :mod:`planner.cost.memory`'s
table): with several pipelines, a TP-sharded tensor held at TP degrees that do not divide each other
is synchronised slice by slice, and those elements cost extra gradient (and ZeRO-1 weight) memory."""

from __future__ import annotations

import math
from collections.abc import Collection

from planner.layout import layer_numel
from planner.model import ModelSpec
from planner.plan import Plan


def partial_params(plan: Plan, pipeline: int, stage: int) -> float:
    """Elements of ONE device of ``plan.pipelines[pipeline].stages[stage]`` whose local shard is
    cut into several sync slices (``X`` in the module docstring): a TP-sharded tensor is cut when
    the finest common layout of its holders (``lcm`` of their TP degrees, :mod:`planner.layout`)
    is finer than this stage's TP degree. 0 with one pipeline (nothing is synchronised). For
    every stage of a plan use :func:`partial_params_table` (one pass over the plan, not one a stage)."""
    return partial_params_table(plan)[pipeline][stage]


def partial_params_table(plan: Plan) -> list[list[float]]:
    """:func:`partial_params` of every stage of ``plan`` (``[pipeline][stage]``), in one pass.

    A stage of TP degree ``t`` has layer ``i`` cut when ``M_i``, the lcm of every pipeline's TP
    degree at layer ``i``, does not divide ``t`` (``lcm(t, M_i) != t``). ``M`` is built once from
    the distinct pipeline shapes (TP degree and layer range per stage), so the cost is
    ``shapes x layers + stages`` rather than ``pipelines^2 x layers`` (issue 31)."""
    pipes = plan.pipelines
    if len(pipes) < 2:
        return [[0.0] * len(p.stages) for p in pipes]
    # one entry per layer chunk (an interleaved stage has several), stage by stage: the first entry
    # holds the embedding and the last the head, as in a plain pipeline; a stage sums its chunks'
    shape_of = [tuple((s.tp, c) for s in p.stages for c in s.chunks) for p in pipes]
    by_shape = partial_params_by_shape(plan.model, set(shape_of))
    out = []
    for p, shape in zip(pipes, shape_of):
        vals = iter(by_shape[shape])
        out.append([sum(next(vals) for _ in s.chunks) for s in p.stages])
    return out


Shape = tuple[tuple[int, tuple[int, int]], ...]  # a pipeline's stages: (TP degree, layer range) each


def partial_params_by_shape(m: ModelSpec, shapes: Collection[Shape]) -> dict[Shape, list[float]]:
    """:func:`partial_params` of every stage of every distinct pipeline ``shape`` of a plan with
    at least two pipelines (what :func:`partial_params_table` and the search's surrogate use)."""
    lcm_at = [1] * m.num_layers
    for shape in shapes:
        for tp, (lo, hi) in shape:
            for i in range(lo, hi):
                lcm_at[i] = math.lcm(lcm_at[i], tp)
    lcm_first = math.lcm(*(shape[0][0] for shape in shapes))
    lcm_last = math.lcm(*(shape[-1][0] for shape in shapes))
    sharded = layer_numel(m)[0]
    memo: dict[tuple[int, tuple[int, int], bool, bool], float] = {}

    def one(tp: int, layers: tuple[int, int], first: bool, last: bool) -> float:
        key = (tp, layers, first, last)
        hit = memo.get(key)
        if hit is None:
            per = sharded / tp
            hit = sum(per for i in range(*layers) if tp % lcm_at[i])  # summed as before, bit for bit
            if first and tp % lcm_first:
                hit += m.embedding_params() / tp
            if last and not m.tie_embeddings and tp % lcm_last:
                hit += m.vocab_size * m.hidden_size / tp
            memo[key] = hit
        return hit

    return {shape: [one(tp, layers, si == 0, si == len(shape) - 1) for si, (tp, layers) in enumerate(shape)]
            for shape in shapes}

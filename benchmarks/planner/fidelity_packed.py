"""Packed rows of the fidelity program: the documents of each micro-batch, and their predicted step.

A packed plan keeps the plan's tokens per micro-batch (``micro_batch_size · seq_len``) but fills
each one row with whole documents of mixed length (:data:`MIX`, fractions of the context, cycled),
so attention work is ``Σ s_d²`` instead of ``mb · S²``: what :mod:`planner.varlen.seq_cost` prices.

Predicted step = the slowest pipeline under :meth:`planner.varlen.seq_cost.PipelineCost.time` of
its packed micro-batches + what the plan's estimate adds after the pipelines (gradient sync, the
gradient norm, the optimizer step: ``step_time_s - max(pipeline time)``).
"""

from __future__ import annotations

from planner.cluster import ClusterSpec
from planner.cost import ProfileSet, estimate
from planner.plan import Plan

MIX = (0.5, 0.125, 1.0, 0.25, 0.0625, 0.375)  # document lengths as fractions of the context


def doc_lengths(tokens: int, context: int, start: int = 0) -> list[int]:
    """Document lengths (labels each, >= 1, <= ``context``) summing to ``tokens``: :data:`MIX` cycled
    from ``start``, the last one cut to what is left."""
    out, i = [], start
    while tokens > 0:
        n = min(tokens, max(1, int(MIX[i % len(MIX)] * context)))
        out.append(n)
        tokens -= n
        i += 1
    return out


def packed_micro_batches(plan: Plan) -> list[list[list[int]]]:
    """Per pipeline, per micro-batch: the document lengths of its one packed row."""
    seq, k = plan.model.seq_len, 0
    out = []
    for pipe in plan.pipelines:
        rows = []
        for size in pipe.micro_batch_sizes():
            rows.append(doc_lengths(size * seq, seq, k))
            k += 1
        out.append(rows)
    return out


def predict_packed(plan: Plan, cluster: ClusterSpec, profiles: ProfileSet, packed: list[list[list[int]]]) -> float:
    """The predicted step time of ``plan`` run on ``packed`` micro-batches (module docstring)."""
    from planner.varlen.seq_cost import pipeline_costs

    est = estimate(plan, cluster, profiles)
    after = est.step_time_s - max(p.time_s for p in est.pipelines)
    costs = pipeline_costs(plan, cluster, profiles=profiles)
    return max(c.time(mbs) for c, mbs in zip(costs, packed)) + after

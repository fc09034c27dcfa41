"""Interleaved 1F1B (Megatron's virtual pipeline; Narayanan et al., SC'21): each stage holds ``v``
layer chunks, chunk ``c`` of stage ``i`` being virtual stage ``c·S + i``, so a micro-batch passes
through every stage ``v`` times and the fill and drain shrink ``v``-fold.

Ops run in groups of ``S`` micro-batches per chunk: the ``k``-th forward of stage ``i`` is chunk
``(k // S) mod v`` of micro-batch ``(k // (S·v))·S + k mod S``; backwards walk the chunks in
reverse. Stage ``i`` runs ``min(2(S-1-i) + (v-1)·S, m·v)`` warm-up forwards, then steady rounds of
one forward and one backward, then the cool-down backwards. It needs ``m`` to be a multiple of
``S``. With equal stages the bubble is ``(S-1)(F+B)/v`` against 1F1B's ``(S-1)(F+B)``, at the cost
of ``v``-fold more p2p sends and more activations held. The messages each stage posts, and why
they never wait on each other, are in :mod:`planner.schedules.comm`. Worked example, ``S=2, v=2, m=2``
(``F1.0`` = forward of micro-batch 1, chunk 0)::

    stage 0:  F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0
    stage 1:  F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 B0.0 B1.0
"""

from __future__ import annotations

from planner.schedules.ops import StageOp

CHUNKS = 2  # the registered entry's default layer chunks per stage (a plan's stages may hold more: Pipeline.chunks)


def _op(kind: str, k: int, stages: int, chunks: int) -> StageOp:
    c = (k // stages) % chunks
    return StageOp(kind, (k // (stages * chunks)) * stages + k % stages,  # type: ignore[arg-type]
                   c if kind == "F" else chunks - 1 - c)


def interleaved_requires(stages: int, micro_batches: int) -> str | None:
    """Why ``micro_batches`` cannot run interleaved on ``stages`` stages, or None (one stage would
    send to itself between chunks, and has no bubble to shrink)."""
    if stages < 2:
        return "interleaved 1F1B needs at least 2 stages"
    if micro_batches % stages:
        return f"interleaved 1F1B needs micro_batches a multiple of the {stages} stages, got {micro_batches}"
    return None


def interleaved_ops(stages: int, stage: int, micro_batches: int, chunks: int = CHUNKS) -> list[StageOp]:
    why = interleaved_requires(stages, micro_batches)
    if why is not None:
        raise ValueError(why)
    total = micro_batches * chunks
    warm = min(2 * (stages - 1 - stage) + (chunks - 1) * stages, total)
    order = [_op("F", k, stages, chunks) for k in range(warm)]
    for k in range(total - warm):
        order += [_op("F", warm + k, stages, chunks), _op("B", k, stages, chunks)]
    return order + [_op("B", k, stages, chunks) for k in range(total - warm, total)]

"""The simulated step as a :class:`planner.timeline.Timeline`: one lane per stage.

Each simulated op of :func:`planner.cost.simulate.simulate` is a forward or backward with its
blocking p2p send folded in (:func:`~planner.cost.simulate.fold_p2p`); here it is split back into
its compute part (TP all-reduces included) and the send that ends it. After the schedule each
stage's lane shows the gradient-sync collectives its devices take part in (a wait for another
pipeline's owners is idle time), then the optimizer step after the global sync point and the
gradient-norm all-reduce, then the ZeRO-1 all-gather (as ``grad_sync``).
"""

from __future__ import annotations

from planner.plan import Plan
from planner.timeline import Lane, Span, Timeline


def stage_lane(pipeline: int, stage: int, ops: list[tuple[str, int, float, float]], compute_f: list[float],
               compute_b: list[float], compute_w: list[float] | None = None, chunks: int = 1,
               shares: list[float] | None = None, op_chunks: list[int] | None = None) -> Lane:
    """A stage's lane from its simulated ops; ``compute_f[j]``/``compute_b[j]`` are micro-batch
    ``j``'s compute, the rest of each op is its p2p send. A split backward's ``W`` op (compute
    ``compute_w[j]``, taken out of ``compute_b[j]``) shows as backward and sends nothing. With
    ``chunks`` layer chunks per stage, each op is one chunk's share: ``shares[c]`` of chunk
    ``op_chunks[k]`` (the simulator's), else ``1/chunks``."""
    lane = Lane(f"p{pipeline} s{stage}", pipeline, stage)
    split = compute_w is not None and any(kind == "W" for kind, *_ in ops)
    for k, (kind, j, start, end) in enumerate(ops):
        w = compute_w[j] if split and compute_w is not None else 0.0
        part = shares[op_chunks[k]] if shares is not None and op_chunks is not None else 1.0 / chunks
        if kind == "W":
            compute = end - start
        else:
            compute = (compute_f[j] if kind == "F" else compute_b[j] - w) * part
        mid = min(end, start + compute)
        lane.spans.append(Span("forward" if kind == "F" else "backward", j, start, mid))
        if end > mid:
            lane.spans.append(Span("p2p", j, mid, end))
    return lane


def merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Overlapping or touching (start, end) intervals joined, in order."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def simulated_timeline(plan: Plan, lanes: list[Lane], *, sync_busy: dict[str, list[tuple[float, float]]],
                       sync_done: float, grad_norm: float, optimizer: dict[str, float],
                       zero_all_gather: float) -> Timeline:
    """Add the step's tail to the stages' lanes: the collectives of the gradient sync that any of a
    stage's devices takes part in (``sync_busy``; waiting for other pipelines stays idle), the
    optimizer step and the ZeRO-1 all-gather."""
    by_stage = {(ln.pipeline, ln.stage): ln for ln in lanes}
    for pi, pipe in enumerate(plan.pipelines):
        for si, st in enumerate(pipe.stages):
            lane = by_stage[pi, si]
            for a, b in merged([iv for d in st.devices for iv in sync_busy.get(d, [])]):
                lane.spans.append(Span("grad_sync", -1, a, b))
            opt_start = sync_done + grad_norm
            opt_end = opt_start + max(optimizer[d] for d in st.devices)
            lane.spans.append(Span("optimizer", -1, opt_start, opt_end))
            if zero_all_gather > 0:
                lane.spans.append(Span("grad_sync", -1, opt_end, opt_end + zero_all_gather))
    return Timeline("simulated step (cost model)", lanes)

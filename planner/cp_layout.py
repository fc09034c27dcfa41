"""Context parallelism's sequence layout: which tokens a CP rank holds, and what crosses a stage
boundary between stages of different ``cp`` (pure, no torch).

Causal load balancing: a sequence of ``S`` tokens is cut into ``2·cp`` equal chunks of
``L = S / (2·cp)``; CP rank ``r`` holds chunks ``r`` and ``2·cp - 1 - r``, in that order, so every
rank has one early (cheap) and one late (expensive) chunk of the causal attention. Activations,
labels and RoPE positions all follow this order.

Worked example, ``S = 8``, ``cp = 2`` (``L = 2``): rank 0 holds tokens ``[0, 2) + [6, 8)``, rank 1
``[2, 4) + [4, 6)``. Across a boundary to a ``cp = 1`` stage both ranks send their two pieces to
the one receiver, which places them at their global positions; to a ``cp = 4`` stage (``L = 1``)
rank 0's tokens ``0, 1, 6, 7`` go to receivers 0, 1, 1, 0 (receiver ``j`` holds ``j`` and
``7 - j``).
"""

from __future__ import annotations

import math

from planner.errors import SpecError
from planner.plan import Plan

Interval = tuple[int, int]


def cp_intervals(seq: int, cp: int, cp_rank: int) -> list[Interval]:
    """Global token intervals ``[start, stop)`` CP rank ``cp_rank`` of ``cp`` holds, in local order."""
    if cp == 1:
        return [(0, seq)]
    if seq % (2 * cp):
        raise ValueError(f"sequence of {seq} tokens does not split into 2 x cp = {2 * cp} equal chunks")
    n = seq // (2 * cp)
    return [(c * n, (c + 1) * n) for c in (cp_rank, 2 * cp - 1 - cp_rank)]


def cp_positions(seq: int, cp: int, cp_rank: int) -> list[int]:
    """Global positions of the local tokens, in local order (RoPE angles, label order)."""
    return [p for a, b in cp_intervals(seq, cp, cp_rank) for p in range(a, b)]


def local_offset(seq: int, cp: int, cp_rank: int, start: int) -> int:
    """Local index of global token ``start`` (which ``cp_rank`` must hold)."""
    off = 0
    for a, b in cp_intervals(seq, cp, cp_rank):
        if a <= start < b:
            return off + start - a
        off += b - a
    raise ValueError(f"token {start} is not held by CP rank {cp_rank} of {cp}")


def shared_intervals(seq: int, cp_a: int, rank_a: int, cp_b: int, rank_b: int) -> list[Interval]:
    """Tokens held both by CP rank ``rank_a`` of ``cp_a`` and ``rank_b`` of ``cp_b``, in global
    order: what crosses a boundary between those two ranks (both sides compute the same list)."""
    out = []
    for a0, a1 in cp_intervals(seq, cp_a, rank_a):
        for b0, b1 in cp_intervals(seq, cp_b, rank_b):
            lo, hi = max(a0, b0), min(a1, b1)
            if lo < hi:
                out.append((lo, hi))
    return sorted(out)


def boundary_peers(cp_a: int, cp_b: int) -> list[tuple[int, int]]:
    """``(i, j)`` CP-rank pairs of a boundary from a ``cp_a`` stage to a ``cp_b`` stage that share
    tokens (for every sequence length the plan allows: multiples of ``2·lcm``), in lexicographic order."""
    seq = 2 * math.lcm(cp_a, cp_b)
    return [(i, j) for i in range(cp_a) for j in range(cp_b) if shared_intervals(seq, cp_a, i, cp_b, j)]


def refuse_cp(plan: Plan, what: str, fix: str, path: str = "") -> None:
    """One :class:`~planner.errors.SpecError` naming the first ``cp > 1`` stage of ``plan`` (under
    ``path``, e.g. ``strategies[1].plan``) when ``what`` cannot run context parallelism yet."""
    for pi, pipe in enumerate(plan.pipelines):
        for si, st in enumerate(pipe.stages):
            if st.cp > 1:
                field = f"pipelines[{pi}].stages[{si}].cp"
                raise SpecError(f"{path}.{field}" if path else field,
                                f"{what} does not run with context parallelism (cp={st.cp}) yet", fix)

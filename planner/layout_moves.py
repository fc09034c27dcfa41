"""Which rank sends which slice of which parameter to whom, between two layouts (pure, no torch).

Two topologies of the same model over the same ranks (two plans of a strategy pool, in one rank
numbering: :func:`planner.strategy_topology.strategy_topology`). A rank of a layout holds, for
every parameter of its stage, the slice ``shard_range(size, tp, tp_rank)`` along the parameter's
shard dimension (all of it for replicated norm scales).

* **Working weights in** (:func:`weight_moves`, copy): every holder of a slice in the *target*
  layout needs it; every pipeline of the *source* layout holds the same values, so each piece
  (the target slice cut at the source shards' boundaries) has one candidate sender per source
  pipeline. A rank that holds the piece itself copies locally; otherwise the candidate with the
  fewest bytes assigned so far sends it (ties: the lowest rank) — HSPMD's rule without the node
  preference (ranks carry no node here).
* **Gradients out** (:func:`grad_moves`, add): source pipeline ``i`` holds a *partial* gradient
  (its own sequences'), so each source pipeline's pieces go to target pipeline ``i mod P`` and
  are added there; the target layout's own cross-pipeline reduction then sums everything
  (:mod:`executor.switch.hot_switch`). Replicated gradients go to every TP rank of the target stage
  (a one-pipeline target has no TP broadcast after its reduction).

Moves are listed in one global order (target rank, then canonical parameter order, then slice
start), which every rank computes alike: the sender packs its moves to a peer in that order into
one buffer and the receiver unpacks them in the same order — one message per pair of ranks.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from planner.layout import ParamInfo, SliceRef, StageTopo, Topology, logical_params, shard_range


@dataclass(frozen=True)
class Move:
    src: int
    dst: int
    ref: SliceRef  # logical coordinates (dim None: the whole replicated parameter)

    @property
    def numel_along(self) -> int:
        return self.ref.stop - self.ref.start


def _held(st: StageTopo, rank: int, dim: int | None, size: int) -> tuple[int, int]:
    """The range of a parameter's shard dim (``size`` long) that ``rank`` of stage ``st`` holds."""
    if dim is None:
        return 0, size
    return shard_range(size, st.tp, st.ranks.index(rank))


def _pieces(lo: int, hi: int, cuts: Sequence[int]) -> list[tuple[int, int]]:
    edges = sorted({lo, hi, *(c for c in cuts if lo < c < hi)})
    return list(zip(edges, edges[1:]))


def _targets(dst: Topology) -> Iterator[tuple[int, StageTopo, ParamInfo, int, tuple[int, int]]]:
    """Every (rank, its stage, parameter it holds, size of the shard dim, its range) of ``dst``, in
    the global order of the moves."""
    for q in range(dst.world_size):
        st = dst.stage_of(q)
        for info in logical_params(dst.model):
            if st.holds(info.name):
                size = info.shape[0] if info.shard_dim is None else info.shape[info.shard_dim]
                yield q, st, info, size, _held(st, q, info.shard_dim, size)


def weight_moves(src: Topology, dst: Topology) -> list[Move]:
    """Moves that give every rank of ``dst`` its slices, from any holder in ``src``."""
    out: list[Move] = []
    load: dict[int, int] = {}
    for q, _st, info, size, (lo, hi) in _targets(dst):
        dim = info.shard_dim
        held = {r: _held(h, r, dim, size) for p in range(len(src.pipelines))
                for h in [src.holder(p, info.name)] for r in h.ranks}
        for a, b in _pieces(lo, hi, [c for rng in held.values() for c in rng]):
            cands = [r for r, (x, y) in held.items() if x <= a and b <= y]
            sender = q if q in cands else min(cands, key=lambda r: (load.get(r, 0), r))
            if sender != q:
                load[sender] = load.get(sender, 0) + (b - a) * (info.numel // size)
            out.append(Move(sender, q, SliceRef(info.name, dim, a, b)))
    return out


def grad_moves(src: Topology, dst: Topology, pipelines: Sequence[int] | None = None) -> list[Move]:
    """Moves that add source pipeline ``i``'s gradients into target pipeline ``i mod P`` (only the
    source pipelines in ``pipelines``, default all: a pipeline that trained nothing sends nothing)."""
    active = set(range(len(src.pipelines)) if pipelines is None else pipelines)
    out: list[Move] = []
    n_dst = len(dst.pipelines)
    for q, st, info, size, (lo, hi) in _targets(dst):
        dim = info.shard_dim
        for p in sorted(active):
            if p % n_dst != st.pipeline:
                continue
            h = src.holder(p, info.name)
            if dim is None:  # identical on every TP rank of the source stage: a local one, else the leader
                out.append(Move(q if q in h.ranks else h.leader, q, SliceRef(info.name, None, 0, size)))
                continue
            for r in h.ranks:
                a, b = _held(h, r, dim, size)
                if max(a, lo) < min(b, hi):
                    out.append(Move(r, q, SliceRef(info.name, dim, max(a, lo), min(b, hi))))
    return out


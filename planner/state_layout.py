"""Which rectangles of the training state every rank of a plan holds (pure, no torch).

The training state is, per logical parameter ``p``, three logical tensors — the checkpoint's names
(:mod:`executor.state.checkpoint_pieces`): ``model/p`` (the fp32 master weights), ``optim/exp_avg/p`` and
``optim/exp_avg_sq/p`` (the AdamW moments) — plus the step count. Rank ``r`` (stage ``s``, TP rank
``t`` of ``s.tp``) holds:

* ``model/p`` for every parameter of its stage: its TP shard (:func:`planner.chunks.shard_chunk`),
  a replicated norm scale whole. Every pipeline holds a full copy of the weights, and every CP
  slot of a ``cp > 1`` stage the same shards as slot 0 (a reshard may read from any of them).
* the moments without ZeRO-1 (``options.zero == 0``, or one pipeline with a stage without CP,
  where the engine runs without it, :func:`zero_sharded`): the same rectangles as the weights.
* the moments under ZeRO-1: its *flat parts* (:mod:`executor.parallel.zero`). Per sync group the rank
  belongs to (topology order), the rank's local views of the group's slices, decayed matrices
  first and then the undecayed norm scales (:func:`planner.layout.decays`), each list cut into
  flat buckets (:func:`planner.flat_buckets.flat_parts`); in a bucket of ``N`` elements the owner at
  position ``i`` of ``k`` owns ``[i·c, min((i+1)·c, N))`` with ``c = ceil(N / k)``, and its part
  is the concatenation of its owned ranges, bucket by bucket. A part is cut into rectangles with
  :func:`planner.chunks.flat_chunks`; each keeps the flat offset of its first element in the part
  (``Holding.at``), where the executor stores it row-major. Every logical moment element is held
  by exactly one rank of the plan.

A :class:`RankState` lists these holdings in one fixed order (weights in parameter order, then
each moment's rectangles): the executor builds one local tensor per holding in the same order
(:mod:`executor.state.state_pieces`), and :mod:`planner.state_move_plan` names holdings by their index.

Worked example (model ``tiny``: hidden 64, ffn 176, 4 layers; two pipelines ``[a:0 a:1]`` (TP 2)
and ``[b:0]`` (TP 1), ZeRO-1): ``layers.0.attn.wq.weight`` is ``(64, 64)`` sharded on dim 0;
``a:0`` holds ``model/…`` rows 0-31 and ``b:0`` rows 0-63. Its finest slices (``lcm(2, 1) = 2``)
are rows 0-31 (owners ``a:0, b:0``) and rows 32-63 (owners ``a:1, b:0``); in the sync group
``(a:0, b:0)`` (one bucket: the part is far below the bucket size) ``a:0`` owns the first half of
the flat vector and ``b:0`` the second, so the
rows 0-31 of wq's moments are split between them by flat position.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from planner.chunks import Chunk, flat_chunks, shard_chunk, view_chunk
from planner.flat_buckets import DEFAULT_BUCKET_NUMEL, FlatPart, LocalView, flat_parts
from planner.layout import Topology, build_topology, stage_params
from planner.plan import Plan

MOMENTS = ("exp_avg", "exp_avg_sq")


@dataclass(frozen=True)
class Holding:
    """One rectangle of one logical state tensor that a rank holds."""

    tensor: str  # "model/<p>", "optim/exp_avg/<p>" or "optim/exp_avg_sq/<p>"
    chunk: Chunk  # logical coordinates; chunk.name is the parameter
    part: int | None = None  # None: the rank's local shard of the parameter; else its ZeRO-1 part
    at: int = 0  # in a part: the flat offset of the rectangle's first element

    @property
    def numel(self) -> int:
        return self.chunk.numel


@dataclass(frozen=True)
class RankState:
    """What one rank of a plan holds (module docstring)."""

    rank: int
    device: str
    holdings: tuple[Holding, ...]
    part_sizes: tuple[int, ...] = ()  # elements of each ZeRO-1 part (per moment); () without ZeRO-1

    @property
    def numel(self) -> int:
        return sum(h.numel for h in self.holdings)


def zero_sharded(plan: Plan) -> bool:
    """Whether the engine shards Adam state: ZeRO-1 where every parameter has two gradient owners
    or more — at least two pipelines, or one whose every stage is split by context parallelism
    (its CP slots own gradients as pipelines do). A lone pipeline with a ``cp == 1`` stage keeps
    whole state: that stage's parameters have no sync group to shard over."""
    if plan.options.zero != 1:
        return False
    return len(plan.pipelines) > 1 or all(s.cp > 1 for s in plan.pipelines[0].stages)


def state_tensor(kind: str, name: str) -> str:
    """``model/<name>`` for ``kind == "model"``, else ``optim/<kind>/<name>``."""
    return f"model/{name}" if kind == "model" else f"optim/{kind}/{name}"


def rank_states(plan: Plan, bucket_numel: int = DEFAULT_BUCKET_NUMEL) -> list[RankState]:
    """The holdings of every rank of ``plan``, in rank order (ZeRO-1 buckets of ``bucket_numel``
    elements, as the executor cuts them)."""
    topo = build_topology(plan)
    devices = plan.devices
    return [_rank_state(plan, topo, r, devices[r], bucket_numel) for r in range(topo.world_size)]


def _rank_state(plan: Plan, topo: Topology, rank: int, device: str, bucket_numel: int) -> RankState:
    st = topo.stage_of(rank)
    tp_rank = st.ranks.index(rank)
    infos = stage_params(plan.model, st.layers, st.is_first, st.is_last, st.chunks)
    shards = [(i, shard_chunk(i, st.tp, tp_rank)) for i in infos]
    out = [Holding(state_tensor("model", i.name), c) for i, c in shards]
    if not zero_sharded(plan):
        out += [Holding(state_tensor(key, i.name), c) for key in MOMENTS for i, c in shards]
        return RankState(rank, device, tuple(out))
    by_name = {i.name: i for i in infos}
    parts = flat_parts(topo, rank, bucket_numel)
    rects = [part_rects(part, lambda v: view_chunk(by_name[v.name], st.tp, tp_rank, v.dim, v.start, v.length))
             for part in parts]
    for key in MOMENTS:
        out += [Holding(state_tensor(key, c.name), c, j, at) for j, rs in enumerate(rects) for at, c in rs]
    return RankState(rank, device, tuple(out), tuple(p.numel for p in parts))


def part_rects(part: FlatPart, chunk_of: Callable[[LocalView], Chunk]) -> list[tuple[int, Chunk]]:
    """The rectangles of ``part``'s ZeRO-1 part (its owned range of every bucket, concatenated in
    bucket order) with their flat offsets inside the part; ``chunk_of`` gives a view's logical
    rectangle."""
    rects: list[tuple[int, Chunk]] = []
    at = 0
    for b in part.buckets:
        lo, hi = b.owned(part.index)
        for v, off in zip(b.views, b.offsets):
            a, e = max(lo, off), min(hi, off + v.numel)
            if a < e:
                rects += [(at + off + first - lo, ch) for first, ch in flat_chunks(chunk_of(v), a - off, e - off)]
        at += hi - lo
    return rects

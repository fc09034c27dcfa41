"""Plan -> ranks: pure rank and group arithmetic for asymmetric 3D parallelism (no torch).

The one layout module: the executor builds its groups from :func:`build_topology`; the cost model
(:mod:`planner.cost.gradsync`, :mod:`planner.cost.step`) and the search's surrogate
(:mod:`planner.search.candidate`) take the finest common slices (:func:`finest_slices`), the
parameter list and the tensors per stage (:func:`stage_tensors`, :func:`layer_numel`) from here.

Vocabulary: a *pipeline* is one data-parallel replica, a *stage* is one TP group inside a pipeline,
a *rank* is one process. Ranks follow the plan contract: pipelines in order, stages in order,
devices in order.

What this module computes
-------------------------
* **TP group of every stage**: the ranks of its devices. Its first rank is the stage *leader*.
* **p2p peers**: activations cross a stage boundary leader-to-leader (``stage.leader`` ->
  ``next_leader``) and are then broadcast inside the receiving TP group; input gradients flow back
  the same way (``leader`` -> ``prev_leader`` + broadcast). This is correct for any pair of TP
  degrees because stage inputs and outputs are replicated across a stage's TP ranks. An
  interleaved stage (several layer chunks, ``StageTopo.chunks``) holds every chunk's parameters,
  and its pipeline's last stage talks to its first between chunks (``p2p_pairs``).
* **Gradient-sync groups** across pipelines. Every TP-sharded weight is viewed in its *finest
  common layout*: ``L = lcm(t_0, ..., t_{P-1})`` equal slices along its shard dimension, where
  ``t_p`` is the TP degree of the stage holding the weight in pipeline ``p``. Slice ``j`` lies
  wholly inside the shard of TP rank ``j // (L / t_p)`` of that stage, so it has exactly one owner
  per pipeline; the slice's gradient is SUM-reduced among those ``P`` owners. A replicated weight
  (an RMSNorm scale) is one slice owned by the holding stage's leader in every pipeline; after the
  reduction the leader broadcasts it inside its TP group (``tp_broadcasts``). Slices with the same
  owner set are bucketed into one :class:`SyncGroup` (one flat all-reduce).
* **Flat buckets**: how each sync group is cut into the buckets one collective reduces lives in
  :mod:`planner.flat_buckets`.

Context parallelism
-------------------
A stage with ``cp > 1`` is ``cp`` CP *slots*, each a TP group of ``tp`` consecutive ranks; the
topology lists one :class:`StageTopo` per slot (``cp_rank``, ``slots``), so "the TP group of a
rank" keeps its meaning. CP slots hold the same weight shards and see different tokens, so every
slot is an owner of its slices, like a pipeline: ``layers.0.attn.wq.weight`` on a cp 2 x tp 1
stage (ranks 0, 1) beside a tp-1 pipeline (rank 2) syncs in ``(0, 1, 2)``. A boundary where a side
has ``cp > 1`` is one p2p pair per two slot leaders that share tokens
(:func:`planner.cp_layout.boundary_peers`); the CP groups (the same TP rank of every slot,
:meth:`StageTopo.cp_group`) carry attention's K/V all-gathers. In an interleaved pipeline every
stage lists the slot leaders of all its stages (``StageTopo.stage_leaders``): its rounds exchange
with them by stage index, and the boundary from the last stage back to the first (between chunks)
has its pairs too (:meth:`Topology.p2p_pairs`).

Worked example
--------------
Model with 4 layers. Pipeline 0: one stage ``[A0, A1]`` (tp 2, layers 0-4). Pipeline 1: stage
``[B0]`` (tp 1, layers 0-2) then ``[B1, B2, B3, B4]`` (tp 4, layers 2-4). Ranks: A0=0 A1=1 B0=2
B1=3 B2=4 B3=5 B4=6.

* TP groups: ``(0, 1)``, ``(2,)``, ``(3, 4, 5, 6)``. p2p: 2 -> 3 forward (then broadcast in
  ``(3, 4, 5, 6)``), 3 -> 2 backward; ``p2p_pairs()`` is ``[(2, 3)]``.
* ``layers.0.attn.wq.weight`` (tp 2 vs tp 1): ``L = 2``; slice 0 owners ``(0, 2)``, slice 1
  owners ``(1, 2)``. ``layers.2.attn.wq.weight`` (tp 2 vs tp 4): ``L = 4``; slices 0..3 owners
  ``(0, 3)``, ``(0, 4)``, ``(1, 5)``, ``(1, 6)``. ``embed.weight`` is like layer 0,
  ``lm_head.weight`` like layer 2.
* Norm scales: layers 0-1 -> ``(0, 2)``; layers 2-3 and ``final_norm`` -> ``(0, 3)``; then rank 0
  broadcasts its norm gradients in ``(0, 1)`` and rank 3 in ``(3, 4, 5, 6)``.
* Sync groups (sorted by rank set): ``(0, 2)``, ``(0, 3)``, ``(0, 4)``, ``(1, 2)``, ``(1, 5)``,
  ``(1, 6)``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from planner.cp_layout import boundary_peers
from planner.model import ModelSpec
from planner.plan import Plan

# ------------------------------------------------------------------------------ parameter layout


@dataclass(frozen=True)
class ParamInfo:
    """A logical (dense) parameter: its name, full shape and the dim split across TP ranks."""

    name: str
    shape: tuple[int, ...]
    shard_dim: int | None  # None: replicated on every TP rank of its stage

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def layer_params(model: ModelSpec, i: int) -> list[ParamInfo]:
    """Parameters of transformer layer ``i``: column-parallel q/k/v/gate/up split dim 0 (output
    features, whole heads), row-parallel o/down split dim 1 (input features)."""
    h, f, kv = model.hidden_size, model.ffn_hidden_size, model.kv_dim
    p = f"layers.{i}."
    return [
        ParamInfo(p + "attn_norm.weight", (h,), None),
        ParamInfo(p + "attn.wq.weight", (h, h), 0),
        ParamInfo(p + "attn.wk.weight", (kv, h), 0),
        ParamInfo(p + "attn.wv.weight", (kv, h), 0),
        ParamInfo(p + "attn.wo.weight", (h, h), 1),
        ParamInfo(p + "mlp_norm.weight", (h,), None),
        ParamInfo(p + "mlp.w_gate.weight", (f, h), 0),
        ParamInfo(p + "mlp.w_up.weight", (f, h), 0),
        ParamInfo(p + "mlp.w_down.weight", (h, f), 1),
    ]


def embed_param(model: ModelSpec) -> ParamInfo:
    return ParamInfo("embed.weight", (model.vocab_size, model.hidden_size), 0)


def head_params(model: ModelSpec) -> list[ParamInfo]:
    """Final norm and LM head (a tied head is the embedding: no tensor of its own)."""
    norm = ParamInfo("final_norm.weight", (model.hidden_size,), None)
    if model.tie_embeddings:
        return [norm]
    return [norm, ParamInfo("lm_head.weight", (model.vocab_size, model.hidden_size), 0)]


def logical_params(model: ModelSpec) -> list[ParamInfo]:
    """Every logical parameter in canonical order (embedding, layers, final norm, head)."""
    out = [embed_param(model)]
    for i in range(model.num_layers):
        out += layer_params(model, i)
    return out + head_params(model)


def stage_params(model: ModelSpec, layers: tuple[int, int], first: bool, last: bool,
                 chunks: Sequence[tuple[int, int]] = ()) -> list[ParamInfo]:
    """Parameters a stage holds, in canonical order; ``chunks``: an interleaved stage's layer
    ranges (ascending; ``layers`` is then the first), all of which it holds."""
    out = [embed_param(model)] if first else []
    for start, end in chunks or (layers,):
        for i in range(start, end):
            out += layer_params(model, i)
    return out + (head_params(model) if last else [])


def decays(name: str) -> bool:
    """Whether AdamW's weight decay applies to logical parameter ``name`` (not to norm scales): the
    optimizer's two parameter groups, and the two flat parts of a ZeRO-1 sync group."""
    return not name.endswith("norm.weight")


@functools.lru_cache(maxsize=64)
def layer_numel(model: ModelSpec) -> tuple[int, int]:
    """Elements of one layer: (TP-sharded weights, replicated norm scales). Cached: the search's
    cost terms ask for it hundreds of thousands of times per plan (models are frozen, hashable)."""
    infos = layer_params(model, 0)
    return (sum(i.numel for i in infos if i.shard_dim is not None), sum(i.numel for i in infos if i.shard_dim is None))


def stage_tensors(model: ModelSpec, num_layers: int, first: bool, last: bool) -> int:
    """Parameter tensors one device of a stage holds (what a per-tensor optimizer step launches)."""
    return (num_layers * _layer_tensors(model) + (1 if first else 0)
            + (len(head_params(model)) if last else 0))


@functools.lru_cache(maxsize=64)
def _layer_tensors(model: ModelSpec) -> int:
    return len(layer_params(model, 0))


def finest_slices(tps: Sequence[int]) -> list[tuple[int, ...]]:
    """The finest common layout of a weight that holders ``p`` shard ``tps[p]`` ways: ``T = lcm(tps)``
    equal slices along the shard dimension; slice ``j`` lies inside the shard of TP rank
    ``j // (T / tps[p])`` of holder ``p``. Per slice, that TP rank in every holder (so each slice
    has one owner per holder). Example: ``finest_slices([2, 4]) == [(0, 0), (0, 1), (1, 2), (1, 3)]``."""
    T = math.lcm(*tps)
    return [tuple(j // (T // t) for t in tps) for j in range(T)]


def shard_range(size: int, tp: int, tp_rank: int) -> tuple[int, int]:
    """Half-open range of a ``size``-long dim held by ``tp_rank`` of ``tp`` (equal contiguous parts)."""
    n = size // tp
    return tp_rank * n, (tp_rank + 1) * n


# ------------------------------------------------------------------------------ topology objects


@dataclass(frozen=True)
class StageTopo:
    """One TP group of a stage: the whole stage, or with ``cp > 1`` one of its ``cp`` CP slots
    (``Topology.pipelines`` lists a stage's slots in CP-rank order, :mod:`planner.cp_layout`)."""

    pipeline: int
    index: int
    ranks: tuple[int, ...]  # the TP group; ranks[0] is the leader
    layers: tuple[int, int]
    is_first: bool
    is_last: bool
    prev_leader: int | None  # leader of the previous stage (None on the first stage)
    next_leader: int | None  # leader of the next stage (None on the last stage)
    cp: int = 1
    cp_rank: int = 0
    slots: tuple[tuple[int, ...], ...] = ()  # every CP slot's TP group of this stage (() when cp == 1)
    prev_leaders: tuple[int, ...] = ()  # slot leaders of the previous stage, CP-rank order (() if cp 1)
    next_leaders: tuple[int, ...] = ()  # slot leaders of the next stage, CP-rank order (() if cp 1)
    chunks: tuple[tuple[int, int], ...] = ()  # an interleaved stage's layer ranges; () means (layers,)
    # an interleaved pipeline: every stage's slot leaders (CP-rank order) by stage index, the peers of
    # its round exchanges (the last stage's chunk sends to the first's); () for one chunk
    stage_leaders: tuple[tuple[int, ...], ...] = ()

    @property
    def tp(self) -> int:
        return len(self.ranks)

    @property
    def leader(self) -> int:
        return self.ranks[0]

    def cp_group(self, tp_rank: int) -> tuple[int, ...]:
        """The CP group of ``tp_rank``: that TP rank of every slot (ranks sharing weight shards)."""
        return tuple(s[tp_rank] for s in self.slots) if self.slots else (self.ranks[tp_rank],)

    @property
    def uses_cp(self) -> bool:
        """Whether this stage or a neighbour splits the sequence (its boundaries need
        :mod:`planner.cp_layout`'s piece-wise exchange)."""
        return (self.cp > 1 or len(self.prev_leaders) > 1 or len(self.next_leaders) > 1
                or any(len(g) > 1 for g in self.stage_leaders))  # interleaved: the wrap's peer too

    def holds(self, name: str) -> bool:
        return any(holds(name, c, self.is_first, self.is_last) for c in self.chunks or (self.layers,))


@dataclass(frozen=True)
class SliceRef:
    """Logical slice ``[start, stop)`` along ``dim`` of parameter ``name`` (``dim`` None: whole
    replicated parameter)."""

    name: str
    dim: int | None
    start: int
    stop: int


@dataclass(frozen=True)
class SyncGroup:
    """Slices whose gradients are SUM-reduced among ``ranks`` (one owner per pipeline)."""

    ranks: tuple[int, ...]
    slices: tuple[SliceRef, ...]


@dataclass(frozen=True)
class TPBroadcast:
    """After the cross-pipeline sync, ``ranks[0]`` broadcasts these replicated gradients to ``ranks``."""

    ranks: tuple[int, ...]
    names: tuple[str, ...]


@dataclass(frozen=True)
class Topology:
    model: ModelSpec
    world_size: int
    pipelines: tuple[tuple[StageTopo, ...], ...]
    sync_groups: tuple[SyncGroup, ...]
    tp_broadcasts: tuple[TPBroadcast, ...]

    def stage_of(self, rank: int) -> StageTopo:
        for pipe in self.pipelines:
            for st in pipe:
                if rank in st.ranks:
                    return st
        raise ValueError(f"rank {rank} is not in the plan (world size {self.world_size})")

    def tp_rank(self, rank: int) -> int:
        return self.stage_of(rank).ranks.index(rank)

    def holder(self, pipeline: int, name: str) -> StageTopo:
        """The stage of ``pipeline`` that holds parameter ``name``."""
        for st in self.pipelines[pipeline]:
            if st.holds(name):
                return st
        raise KeyError(name)

    def tp_groups(self) -> list[tuple[int, ...]]:
        return [st.ranks for pipe in self.pipelines for st in pipe]

    def p2p_pairs(self) -> list[tuple[int, int]]:
        """``(leader, next_leader)`` of every stage boundary: pipelines in order, boundaries in order.
        Where a side has ``cp > 1``, one pair per two slot leaders that share tokens
        (:func:`planner.cp_layout.boundary_peers`, lexicographic). An interleaved pipeline of more
        than two stages adds its boundary between chunks, last stage to first: ``(last leader, first
        leader)``, or with CP the slot-leader pairs that share tokens (of two stages, that boundary
        is the one boundary, whose groups serve both directions)."""
        out = []
        for pipe in self.pipelines:
            for st in pipe:
                if st.next_leader is None or st.cp_rank:
                    continue
                if not st.uses_cp:
                    out.append((st.leader, st.next_leader))
                    continue
                mine = [g[0] for g in st.slots] if st.slots else [st.leader]
                out += [(mine[i], st.next_leaders[j]) for i, j in boundary_peers(len(mine), len(st.next_leaders))]
            ring = pipe[0].stage_leaders
            if ring and len(ring) > 2:
                out += [(ring[-1][i], ring[0][j]) for i, j in boundary_peers(len(ring[-1]), len(ring[0]))]
        return out

    def local_slice(self, rank: int, ref: SliceRef) -> tuple[int | None, int, int]:
        """``ref`` in the coordinates of ``rank``'s local shard: (dim, start, stop)."""
        if ref.dim is None:
            return None, ref.start, ref.stop
        st = self.stage_of(rank)
        info = param_info(self.model, ref.name)
        lo, hi = shard_range(info.shape[ref.dim], st.tp, st.ranks.index(rank))
        if not (lo <= ref.start and ref.stop <= hi):
            raise ValueError(f"slice {ref} is not inside rank {rank}'s shard [{lo}, {hi})")
        return ref.dim, ref.start - lo, ref.stop - lo


def holds(name: str, layers: tuple[int, int], first: bool, last: bool) -> bool:
    if name == "embed.weight":
        return first
    if name in ("final_norm.weight", "lm_head.weight"):
        return last
    if name.startswith("layers."):
        i = int(name.split(".")[1])
        return layers[0] <= i < layers[1]
    raise KeyError(name)


def param_info(model: ModelSpec, name: str) -> ParamInfo:
    if name.startswith("layers."):
        for p in layer_params(model, int(name.split(".")[1])):
            if p.name == name:
                return p
    for p in [embed_param(model), *head_params(model)]:
        if p.name == name:
            return p
    raise KeyError(name)


def build_topology(plan: Plan) -> Topology:
    """All ranks and groups of ``plan`` (pure; see the module docstring for a worked example)."""
    pipes: list[tuple[StageTopo, ...]] = []
    rank = 0
    for pi, pipe in enumerate(plan.pipelines):
        slots: list[tuple[tuple[int, ...], ...]] = []  # per stage, its CP slots' TP groups
        for st in pipe.stages:
            slots.append(tuple(tuple(range(rank + c * st.tp, rank + (c + 1) * st.tp)) for c in range(st.cp)))
            rank += st.tp * st.cp
        n = len(pipe.stages)
        pipes.append(tuple(
            StageTopo(pipeline=pi, index=si, ranks=group, layers=st.layers, is_first=si == 0,
                      is_last=si == n - 1, prev_leader=slots[si - 1][0][0] if si > 0 else None,
                      next_leader=slots[si + 1][0][0] if si < n - 1 else None, cp=st.cp, cp_rank=c,
                      slots=slots[si] if st.cp > 1 else (),
                      prev_leaders=tuple(g[0] for g in slots[si - 1]) if si > 0 else (),
                      next_leaders=tuple(g[0] for g in slots[si + 1]) if si < n - 1 else (),
                      chunks=st.chunks if len(st.chunks) > 1 else (),
                      stage_leaders=tuple(tuple(g[0] for g in sl) for sl in slots) if len(st.chunks) > 1 else ())
            for si, st in enumerate(pipe.stages) for c, group in enumerate(slots[si])))
    topo_pipes = tuple(pipes)
    sync, bcasts = _sync_plan(plan.model, topo_pipes)
    return Topology(plan.model, rank, topo_pipes, sync, bcasts)


def _sync_plan(model: ModelSpec, pipes: tuple[tuple[StageTopo, ...], ...]
               ) -> tuple[tuple[SyncGroup, ...], tuple[TPBroadcast, ...]]:
    """Owners of every slice: one per pipeline, times the CP slots of the holding stage (CP ranks
    hold the same shards and see different tokens, so their gradients add up like pipelines')."""
    by_ranks: dict[tuple[int, ...], list[SliceRef]] = {}
    bcast: dict[tuple[int, ...], list[str]] = {}
    for info in logical_params(model):
        holders = [[st for st in pipe if st.holds(info.name)] for pipe in pipes]
        if info.shard_dim is None:
            owners = tuple(st.leader for slots in holders for st in slots)
            by_ranks.setdefault(owners, []).append(SliceRef(info.name, None, 0, info.shape[0]))
            if len(owners) > 1:
                for slots in holders:
                    for st in slots:
                        if st.tp > 1:
                            bcast.setdefault(st.ranks, []).append(info.name)
            continue
        slices = finest_slices([slots[0].tp for slots in holders])
        width = info.shape[info.shard_dim] // len(slices)
        for j, tp_ranks in enumerate(slices):
            owners = tuple(st.ranks[r] for slots, r in zip(holders, tp_ranks) for st in slots)
            by_ranks.setdefault(owners, []).append(SliceRef(info.name, info.shard_dim, j * width, (j + 1) * width))
    groups = tuple(SyncGroup(r, tuple(s)) for r, s in sorted(by_ranks.items()) if len(r) > 1)
    bcasts = tuple(TPBroadcast(r, tuple(n)) for r, n in sorted(bcast.items()))
    return groups, bcasts

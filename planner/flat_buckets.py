"""A rank's sync slices as flat buckets (pure, no torch): a sync group's slices in one owner's local
shards (:func:`local_views`), decayed and undecayed apart, cut into buckets of at most
``bucket_numel`` elements; the executor reduces each bucket with one collective (in the global
:func:`reduce_order`) and under ZeRO-1 each owner owns ``1/k`` of every bucket. The executor's
buffers (:mod:`executor.parallel.grad_sync`) and the state layout (:mod:`planner.state_layout`)
both take them from here; the slices come from :func:`planner.layout.build_topology`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from planner.layout import SyncGroup, Topology, decays, logical_params, param_info

DEFAULT_BUCKET_NUMEL = 1 << 25  # 32 Mi elements (128 MiB of fp32) per flat bucket


@dataclass(frozen=True)
class LocalView:
    """A sync slice in the coordinates of one owner's local shard: ``length`` entries from
    ``start`` along ``dim`` (None: the whole replicated tensor); ``numel`` elements; ``whole`` when
    it is the entire local shard (then the shard can live inside a flat buffer)."""

    name: str
    dim: int | None
    start: int
    length: int
    numel: int
    whole: bool


@dataclass(frozen=True)
class FlatBucket:
    """Views laid out back to back (``offsets``), reduced by one collective among ``k`` owners. Under
    ZeRO-1 the bucket is padded to ``k * chunk`` elements and owner ``i`` owns ``[i·chunk,
    min((i+1)·chunk, numel))``. ``position``: the canonical index (:func:`logical_params`) of its
    first parameter; the issue order sorts on it (:func:`reduce_order`)."""

    views: tuple[LocalView, ...]
    offsets: tuple[int, ...]
    k: int
    position: int

    @property
    def numel(self) -> int:
        return self.offsets[-1] + self.views[-1].numel

    @property
    def chunk(self) -> int:
        return -(-self.numel // self.k)

    @property
    def padded(self) -> int:
        return self.chunk * self.k

    def owned(self, index: int) -> tuple[int, int]:
        lo = min(index * self.chunk, self.numel)
        return lo, min(lo + self.chunk, self.numel)


@dataclass(frozen=True)
class FlatPart:
    """One sync group's local views on one owner, decayed matrices or undecayed norm scales
    (:func:`decays`), in canonical order, cut into buckets of at most ``bucket_numel`` elements
    (walking backwards, so the last parameters fill the first bucket; a larger view is a bucket of
    its own). ``index``: this owner's position in ``ranks``; ``group``: the sync group's position
    in ``Topology.sync_groups``. Its ZeRO-1 part is the concatenation of the owned ranges of its
    buckets, in bucket order: ``numel`` elements."""

    ranks: tuple[int, ...]
    index: int
    group: int
    decayed: bool
    buckets: tuple[FlatBucket, ...]

    @property
    def views(self) -> tuple[LocalView, ...]:
        return tuple(v for b in self.buckets for v in b.views)

    @property
    def numel(self) -> int:
        return sum(hi - lo for lo, hi in (b.owned(self.index) for b in self.buckets))


def local_views(topo: Topology, rank: int, group: SyncGroup) -> list[LocalView]:
    """``group``'s slices in ``rank``'s local shards (the one place both the executor's buffers
    and the state layout take them from)."""
    st = topo.stage_of(rank)
    out = []
    for ref in group.slices:
        dim, lo, hi = topo.local_slice(rank, ref)
        info = param_info(topo.model, ref.name)
        local = [n // st.tp if d == info.shard_dim else n for d, n in enumerate(info.shape)]
        total = math.prod(local)
        if dim is None:
            out.append(LocalView(ref.name, None, lo, hi - lo, total, True))
        else:
            out.append(LocalView(ref.name, dim, lo, hi - lo, total // local[dim] * (hi - lo), hi - lo == local[dim]))
    return out


def flat_parts(topo: Topology, rank: int, bucket_numel: int = DEFAULT_BUCKET_NUMEL) -> list[FlatPart]:
    """The flat parts of every sync group holding ``rank``, in topology order, decayed part first.
    Every owner of a group computes the same buckets (its views have the same sizes)."""
    index = {p.name: i for i, p in enumerate(logical_params(topo.model))}
    out = []
    for gi, g in enumerate(topo.sync_groups):
        if rank not in g.ranks:
            continue
        views = local_views(topo, rank, g)
        for decayed in (True, False):
            mine = [v for v in views if decays(v.name) == decayed]
            if not mine:
                continue
            cut: list[list[LocalView]] = [[]]
            size = 0
            for v in reversed(mine):
                if cut[-1] and size + v.numel > bucket_numel:
                    cut.append([])
                    size = 0
                cut[-1].append(v)
                size += v.numel
            buckets = []
            for vs in reversed(cut):
                vs.reverse()
                offs = [0]
                for v in vs[:-1]:
                    offs.append(offs[-1] + v.numel)
                buckets.append(FlatBucket(tuple(vs), tuple(offs), len(g.ranks), index[vs[0].name]))
            out.append(FlatPart(g.ranks, g.ranks.index(rank), gi, decayed, tuple(buckets)))
    return out


def reduce_order(parts: Sequence[FlatPart]) -> list[tuple[int, int]]:
    """``(part, bucket)`` indices of ``parts`` in the plan-wide reduction order: latest parameters
    first (their gradients are final first in backward), ties broken by sync group, decayed part
    first, later bucket first. The key depends only on the bucket, which every owner computes alike,
    so all ranks issue subsequences of one global order (:mod:`executor.parallel.grad_sync`)."""
    keys = [((-b.position, p.group, not p.decayed, -j), (i, j))
            for i, p in enumerate(parts) for j, b in enumerate(p.buckets)]
    return [ij for _, ij in sorted(keys)]

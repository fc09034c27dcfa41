"""Moving the training state from one plan to another (pure, no torch): which device sends which
rectangle of which state tensor to which device, one message per ordered pair of devices.

Input: the old plan, the new plan and, optionally, the cluster. Devices are the cluster's ids, so a
device in both plans keeps what it holds: its process stays and reuses its own copy. What each
rank holds and needs comes from :mod:`planner.state_layout` (weights, AdamW moments, ZeRO-1
parts); the step count travels apart (:mod:`executor.switch.state_move`).

Algorithm (HSPMD's switch, with ZeRO-1 kept on). For every rectangle ``R`` of a state tensor that
a device ``d`` of the new plan needs (new ranks in order, each rank's holdings in order):

1. **Finest common pieces.** ``R`` is cut along every boundary of the old holdings of that tensor
   that overlap it (a grid: shard boundaries of any TP degree, ZeRO-1 part boundaries). Each cell
   lies wholly inside one or more old holdings: its *candidates* (one per old pipeline for
   weights and ZeRO-0 moments, exactly one for ZeRO-1 moments).
2. **Reuse.** If ``d`` itself holds the cell in the old plan, it is a local copy: no bytes move.
3. **Sender.** Otherwise the candidate on ``d``'s node, else the one over the fastest link to ``d``
   (cluster links), and among equals the one with the fewest bytes assigned so far (then old rank
   order). The greedy runs in the fixed order above, so every process computes the same plan.
4. **Merge.** Neighbouring cells with the same sender and the same source holding are merged back
   into rectangles (runs along the last dim, then equal runs of consecutive row bands).

**Messages.** All pieces from device ``a`` to device ``b`` form one message, in the order of
:attr:`ReshardPlan.pieces`: ``a`` packs them into one flat buffer, ``b`` unpacks them in the same
order. Both compute the same plan from the same inputs, so no message carries a header, and each
ordered pair of devices exchanges at most one buffer.

**Process order of a switch** (:attr:`ReshardPlan.devices`): the new plan's devices in rank order,
then the devices that leave, in old rank order. :meth:`ReshardPlan.pairs` lists the unordered pairs
that exchange anything in that order (the global order in which the executor creates and uses one
communicator per pair).

**Lower bound** of the switch time (:meth:`ReshardPlan.lower_bound_s`): the largest, over
devices, of ``max(bytes in, bytes out) ÷ bandwidth``, the bandwidth being the fastest link the
device uses in this switch (a device moves data no faster than that), or one measured bandwidth.

Golden example (``tests/planner/test_reshard.py``): ``tiny`` from one TP-2 pipeline ``[a:0 a:1]``
to two pipelines ``[a:0] | [b:0]``: ``a:0`` keeps its half and receives the other half of every
sharded tensor from ``a:1``; ``b:0`` needs everything, and takes each piece from the one of
``a:0, a:1`` that holds it (the only candidates), so both senders carry about the same bytes.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from planner.chunks import Chunk, contains, intersect
from planner.cluster import ClusterSpec
from planner.errors import SpecError
from planner.plan import Plan
from planner.state_layout import RankState, rank_states

BYTES_PER_ELEMENT = 4  # weights and moments are fp32


@dataclass(frozen=True)
class Piece:
    """One rectangle of one state tensor, from a holding of ``src`` (old plan) to one of ``dst``
    (new plan); the slots index :attr:`RankState.holdings` of the two ranks."""

    tensor: str
    chunk: Chunk
    src: str
    dst: str
    src_slot: int
    dst_slot: int

    @property
    def numel(self) -> int:
        return self.chunk.numel

    @property
    def nbytes(self) -> int:
        return self.chunk.numel * BYTES_PER_ELEMENT


@dataclass(frozen=True)
class _Holder:
    device: str
    slot: int
    chunk: Chunk
    order: int  # old rank: the last tie-break


@dataclass(frozen=True)
class ReshardPlan:
    old: Plan
    new: Plan
    pieces: tuple[Piece, ...]

    @cached_property
    def devices(self) -> tuple[str, ...]:
        """The switch's process order: new plan's devices, then the leaving ones (old rank order)."""
        new = self.new.devices
        return tuple(new) + tuple(d for d in self.old.devices if d not in set(new))

    @property
    def leaving(self) -> tuple[str, ...]:
        return tuple(d for d in self.old.devices if d not in set(self.new.devices))

    @property
    def joining(self) -> tuple[str, ...]:
        return tuple(d for d in self.new.devices if d not in set(self.old.devices))

    @cached_property
    def messages(self) -> dict[tuple[str, str], tuple[Piece, ...]]:
        """``(src, dst) -> pieces`` in message order, for every pair of different devices."""
        out: dict[tuple[str, str], list[Piece]] = {}
        for p in self.pieces:
            if p.src != p.dst:
                out.setdefault((p.src, p.dst), []).append(p)
        return {k: tuple(v) for k, v in out.items()}

    def local(self, device: str) -> list[Piece]:
        """Pieces ``device`` copies from its own old holdings to its new ones."""
        return [p for p in self.pieces if p.src == device and p.dst == device]

    def pairs(self) -> list[tuple[str, str]]:
        """Unordered pairs ``(a, b)`` (``a`` before ``b`` in :attr:`devices`) that exchange
        anything, sorted by their positions in :attr:`devices`."""
        pos = {d: i for i, d in enumerate(self.devices)}
        keys = {(s, d) if pos[s] < pos[d] else (d, s) for s, d in self.messages}
        return sorted(keys, key=lambda k: (pos[k[0]], pos[k[1]]))

    @cached_property
    def _traffic(self) -> tuple[dict[str, int], dict[str, int]]:
        out: dict[str, int] = {}
        into: dict[str, int] = {}
        for (s, d), ps in self.messages.items():
            n = sum(p.nbytes for p in ps)
            out[s] = out.get(s, 0) + n
            into[d] = into.get(d, 0) + n
        return out, into

    def bytes_out(self, device: str) -> int:
        return self._traffic[0].get(device, 0)

    def bytes_in(self, device: str) -> int:
        return self._traffic[1].get(device, 0)

    @property
    def moved_bytes(self) -> int:
        return sum(p.nbytes for p in self.pieces if p.src != p.dst)

    @property
    def local_bytes(self) -> int:
        return sum(p.nbytes for p in self.pieces if p.src == p.dst)

    def lower_bound_s(self, *, cluster: ClusterSpec | None = None, bandwidth_GBps: float | None = None) -> float:
        """Max over devices of ``max(bytes in, bytes out) / bandwidth`` (module docstring): the
        bandwidth is ``bandwidth_GBps`` if given, else the device's fastest link in ``cluster`` to
        the peers it exchanges with."""
        if bandwidth_GBps is None and cluster is None:
            raise ValueError("lower_bound_s needs the cluster or a bandwidth")
        worst = 0.0
        peers_of: dict[str, set[str]] = {}
        for a, b in self.messages:
            peers_of.setdefault(a, set()).add(b)
            peers_of.setdefault(b, set()).add(a)
        for d in self.devices:
            peers = peers_of.get(d, set())
            if not peers:
                continue
            if bandwidth_GBps is not None:
                bw = bandwidth_GBps
            else:
                assert cluster is not None
                bw = max(cluster.link(d, p).bandwidth_GBps for p in peers)
            worst = max(worst, max(self.bytes_in(d), self.bytes_out(d)) / (bw * 1e9))
        return worst

    def report(self, *, cluster: ClusterSpec | None = None, bandwidth_GBps: float | None = None) -> dict[str, Any]:
        """Plain-data summary: bytes per device, messages, the lower bound (when a bandwidth is known)."""
        out: dict[str, Any] = {
            "leaving": list(self.leaving), "joining": list(self.joining), "messages": len(self.messages),
            "pieces": len(self.pieces), "moved_bytes": self.moved_bytes, "local_bytes": self.local_bytes,
            "bytes": {d: {"in": self.bytes_in(d), "out": self.bytes_out(d)} for d in self.devices},
        }
        if cluster is not None or bandwidth_GBps is not None:
            out["lower_bound_s"] = self.lower_bound_s(cluster=cluster, bandwidth_GBps=bandwidth_GBps)
        return out


def reshard_plan(old: Plan, new: Plan, cluster: ClusterSpec | None = None) -> ReshardPlan:
    """The pieces that turn ``old``'s state layout into ``new``'s (module docstring)."""
    if old.model != new.model:
        raise SpecError("plan.model", f"the new plan trains model {new.model.name!r}, the running job "
                        f"{old.model.name!r} (or another shape of it)", "re-plan for the same model")
    holders: dict[str, list[_Holder]] = {}
    for st in rank_states(old):
        for slot, h in enumerate(st.holdings):
            holders.setdefault(h.tensor, []).append(_Holder(st.device, slot, h.chunk, st.rank))
    links = _Links(cluster)
    load: dict[str, int] = {}
    pieces: list[Piece] = []
    for st in rank_states(new):
        for slot, need in enumerate(st.holdings):
            pieces += _fill(st, slot, need.tensor, need.chunk, holders.get(need.tensor, []), links, load)
    return ReshardPlan(old, new, tuple(pieces))


class _Links:
    """Node and link bandwidth of devices (from the cluster; else the node is the id's prefix)."""

    def __init__(self, cluster: ClusterSpec | None):
        self.cluster = cluster

    def node(self, device: str) -> str:
        if self.cluster is not None and self.cluster.has_device(device):
            return self.cluster.device(device).node
        return device.partition(":")[0]

    def bandwidth(self, a: str, b: str) -> float:
        if self.cluster is not None and self.cluster.has_device(a) and self.cluster.has_device(b):
            return self.cluster.link(a, b).bandwidth_GBps
        return 0.0


def _fill(st: RankState, slot: int, tensor: str, need: Chunk, holders: Sequence[_Holder], links: _Links,
          load: dict[str, int]) -> list[Piece]:
    """The pieces that fill holding ``slot`` (``need``) of new rank ``st`` (steps 1-4)."""
    over = [h for h in holders if intersect(h.chunk, need) is not None]
    axes = []
    for d in range(len(need.sizes)):
        lo, hi = need.offsets[d], need.offsets[d] + need.sizes[d]
        edges = {lo, hi} | {e for h in over for e in (h.chunk.offsets[d], h.chunk.offsets[d] + h.chunk.sizes[d])
                             if lo < e < hi}
        cuts = sorted(edges)
        axes.append(list(zip(cuts, cuts[1:])))
    grid: dict[tuple[int, ...], _Holder] = {}
    for idx in itertools.product(*(range(len(a)) for a in axes)):
        cell = _cell(need.name, [axes[d][i] for d, i in enumerate(idx)])
        cands = [h for h in over if contains(h.chunk, cell)]
        if not cands:
            raise RuntimeError(f"{tensor} {cell} is held by no rank of the old plan")
        mine = [h for h in cands if h.device == st.device]
        if mine:
            grid[idx] = mine[0]
            continue
        dst_node = links.node(st.device)
        pick = min(cands, key=lambda h: (links.node(h.device) != dst_node, -links.bandwidth(h.device, st.device),
                                         load.get(h.device, 0), h.order))
        load[pick.device] = load.get(pick.device, 0) + cell.numel * BYTES_PER_ELEMENT
        grid[idx] = pick
    return [Piece(tensor, _cell(need.name, span), h.device, st.device, h.slot, slot)
            for span, h in _merge(axes, grid)]


def _cell(name: str, spans: Sequence[tuple[int, int]]) -> Chunk:
    return Chunk(name, tuple(a for a, _ in spans), tuple(b - a for a, b in spans))


def _merge(axes: list[list[tuple[int, int]]], grid: dict[tuple[int, ...], _Holder]
           ) -> list[tuple[list[tuple[int, int]], _Holder]]:
    """Rectangles of equal holders: runs along the last axis, then equal runs of consecutive rows
    (1-D and 2-D tensors)."""
    if len(axes) == 1:
        runs: list[tuple[list[tuple[int, int]], _Holder]] = []
        for i, span in enumerate(axes[0]):
            h = grid[(i,)]
            if runs and runs[-1][1] == h:
                runs[-1][0][0] = (runs[-1][0][0][0], span[1])
            else:
                runs.append(([span], h))
        return runs
    if len(axes) != 2:
        raise ValueError(f"only 1-D and 2-D state tensors are supported, got {len(axes)}-D")
    out: list[tuple[list[tuple[int, int]], _Holder]] = []
    open_runs: dict[tuple[int, int, _Holder], int] = {}  # (col lo, col hi, holder) -> index in out
    for i, rows in enumerate(axes[0]):
        row_runs: list[tuple[int, int, _Holder]] = []
        for j, cols in enumerate(axes[1]):
            h = grid[(i, j)]
            if row_runs and row_runs[-1][2] == h:
                row_runs[-1] = (row_runs[-1][0], cols[1], h)
            else:
                row_runs.append((cols[0], cols[1], h))
        still: dict[tuple[int, int, _Holder], int] = {}
        for run in row_runs:
            k = open_runs.get(run)
            if k is not None:
                spans, held = out[k]
                out[k] = ([(spans[0][0], rows[1]), spans[1]], held)
            else:
                k = len(out)
                out.append(([rows, (run[0], run[1])], run[2]))
            still[run] = k
        open_runs = still
    return out

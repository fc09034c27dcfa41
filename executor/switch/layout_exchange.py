"""Carrying out the moves of :mod:`planner.layout_moves` on one rank: local copies, then one
batched exchange in which every pair of ranks sends at most one flat buffer each way.

``Reshard(moves, rank, src_topology, dst_topology)`` keeps only this rank's moves. ``run(src,
dst, add=...)`` reads the source tensors (``src[name]`` = this rank's local shard in the source
layout) and writes (``add=False``) or adds (``add=True``) into the target tensors. The exchange
posts every send and receive of the rank at once (``batch_isend_irecv``) and waits for all, on
``group`` — a group of all ranks used for nothing else (on NCCL a communicator of its own, created
and connected with the strategies' groups before the first step, :mod:`executor.switch.hot_switch`).
``wire_dtype`` (e.g. bf16 for working weights on GPUs) halves the bytes; the CPU oracle sends fp32.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from planner.layout import Topology
from planner.layout_moves import Move

LocalView = tuple[str, int | None, int, int]  # (name, dim, start, length) in the local shard


def _local(topo: Topology, rank: int, m: Move) -> LocalView:
    dim, lo, hi = topo.local_slice(rank, m.ref)
    return m.ref.name, dim, lo, hi - lo


def _view(t: torch.Tensor, v: LocalView) -> torch.Tensor:
    _, dim, start, length = v
    return t if dim is None else t.narrow(dim, start, length)


class Reshard:
    def __init__(self, moves: Sequence[Move], rank: int, src: Topology, dst: Topology, *, group: Any = None,
                 wire_dtype: torch.dtype | None = None):
        self.rank = rank
        self.group = group
        self.wire_dtype = wire_dtype
        self.local: list[tuple[LocalView, LocalView]] = []
        self.send: dict[int, list[LocalView]] = {}
        self.recv: dict[int, list[LocalView]] = {}
        for m in moves:
            if m.src == rank and m.dst == rank:
                self.local.append((_local(src, rank, m), _local(dst, rank, m)))
            elif m.src == rank:
                self.send.setdefault(m.dst, []).append(_local(src, rank, m))
            elif m.dst == rank:
                self.recv.setdefault(m.src, []).append(_local(dst, rank, m))

    def run(self, src: Mapping[str, torch.Tensor], dst: Mapping[str, torch.Tensor], *, add: bool) -> int:
        """Move the slices; returns the number of elements this rank sent to other ranks."""
        for a, b in self.local:
            target = _view(dst[b[0]], b)
            source = _view(src[a[0]], a)
            if add:
                target.add_(source)
            else:
                target.copy_(source)
        ops, inbox = [], []
        sent = 0
        for peer in sorted(self.send):
            flat = torch.cat([_view(src[v[0]], v).reshape(-1) for v in self.send[peer]])
            if self.wire_dtype is not None:
                flat = flat.to(self.wire_dtype)
            sent += flat.numel()
            ops.append(dist.P2POp(dist.isend, flat, peer, group=self.group))
        for peer in sorted(self.recv):
            views = [_view(dst[v[0]], v) for v in self.recv[peer]]
            buf = torch.empty(sum(x.numel() for x in views), dtype=self.wire_dtype or views[0].dtype,
                              device=views[0].device)
            inbox.append((buf, views))
            ops.append(dist.P2POp(dist.irecv, buf, peer, group=self.group))
        if ops:
            for req in dist.batch_isend_irecv(ops):
                req.wait()
        for buf, views in inbox:
            off = 0
            for v in views:
                part = buf[off:off + v.numel()].view(v.shape).to(v.dtype)
                off += v.numel()
                if add:
                    v.add_(part)
                else:
                    v.copy_(part)
        return sent

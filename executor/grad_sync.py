"""Cross-pipeline gradient synchronisation over finest-common slices (see :mod:`executor.topology`).

Each pipeline's gradients are already scaled by its share of the global tokens (the loss of every
micro-batch is divided by the *global* token count), so a plain SUM over pipelines gives the
gradient of the global mean loss — whatever the pipelines' batch sizes, micro-batch counts or
layouts. For every :class:`~executor.topology.SyncGroup` this rank belongs to (visited in the
topology's global order, which every rank shares, so no two ranks wait on each other in opposite
orders), the local views of its slices are flattened into buckets of at most ``bucket_numel``
elements, all-reduced once per bucket and copied back. Then the leaders of TP stages broadcast the
reduced replicated gradients (norm scales) to their TP groups. Reduction runs in fp32.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from executor.groups import ProcessGroups

DEFAULT_BUCKET_NUMEL = 1 << 25  # 32 Mi elements (128 MiB of fp32) per flat all-reduce


class GradSync:
    def __init__(self, groups: ProcessGroups, params: dict[str, torch.nn.Parameter], *,
                 bucket_numel: int = DEFAULT_BUCKET_NUMEL):
        topo = groups.topology
        rank = groups.rank
        self.groups = groups
        self.params = params
        self.bucket_numel = bucket_numel
        # (group, [(name, dim, start, length)]) for every sync group holding this rank, in global order
        self.reduces: list[tuple[object, list[tuple[str, int | None, int, int]]]] = []
        for g in topo.sync_groups:
            if rank not in g.ranks:
                continue
            views = []
            for ref in g.slices:
                dim, lo, hi = topo.local_slice(rank, ref)
                views.append((ref.name, dim, lo, hi - lo))
            self.reduces.append((groups.group(g.ranks), views))
        self.bcasts: list[tuple[object, int, list[str]]] = [
            (groups.group(b.ranks), b.ranks[0], list(b.names)) for b in topo.tp_broadcasts if rank in b.ranks]

    def _view(self, name: str, dim: int | None, start: int, length: int) -> torch.Tensor:
        grad = self.params[name].grad
        assert grad is not None, f"no gradient for {name}"
        return grad if dim is None else grad.narrow(dim, start, length)

    def _buckets(self, views: list[torch.Tensor]) -> list[list[torch.Tensor]]:
        out: list[list[torch.Tensor]] = [[]]
        size = 0
        for v in views:
            if out[-1] and size + v.numel() > self.bucket_numel:
                out.append([])
                size = 0
            out[-1].append(v)
            size += v.numel()
        return out

    @staticmethod
    def _flat_collective(views: list[torch.Tensor], op) -> None:  # type: ignore[no-untyped-def]
        flat = torch.cat([v.reshape(-1).float() for v in views])
        op(flat)
        off = 0
        for v in views:
            n = v.numel()
            v.copy_(flat[off:off + n].view(v.shape))
            off += n

    def sync(self) -> None:
        """SUM-reduce every slice among its owners, then broadcast replicated gradients in TP groups."""
        for group, refs in self.reduces:
            views = [self._view(*r) for r in refs]
            for bucket in self._buckets(views):
                self._flat_collective(bucket, lambda t, g=group: dist.all_reduce(t, group=g))
        for group, src, names in self.bcasts:
            views = [self._view(n, None, 0, 0) for n in names]
            for bucket in self._buckets(views):
                self._flat_collective(bucket, lambda t, g=group, s=src: dist.broadcast(t, src=s, group=g))

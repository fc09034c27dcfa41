"""Cross-pipeline gradient synchronisation over finest-common slices (see :mod:`planner.layout`).

Each pipeline's gradients are already scaled by its share of the global tokens (the loss of every
micro-batch is divided by the *global* token count), so a plain SUM over pipelines gives the
gradient of the global mean loss — whatever the pipelines' batch sizes, micro-batch counts or
layouts. For every :class:`~planner.layout.SyncGroup` this rank belongs to (visited in the
topology's global order, which every rank shares, so no two ranks wait on each other in opposite
orders), the local views of its slices are flattened into buckets of at most ``bucket_numel``
elements, all-reduced once per bucket and copied back. Then the leaders of TP stages broadcast the
reduced replicated gradients (norm scales) to their TP groups. Reduction runs in fp32.

Overlap with backward (:meth:`GradSync.arm`): buckets are issued in one fixed order shared by
every rank — the global order above, reversed, so the last layers' buckets (whose gradients are
final first in backward) come first. A post-accumulate-grad hook counts each parameter's
accumulations; after the ``expected``-th (its last micro-batch) the parameter is final, and every
bucket at the head of the order whose parameters are all final is flattened and its all-reduce
launched asynchronously. :meth:`sync` launches what is left (in order), waits for all, copies the
reduced values back, then broadcasts the replicated gradients. Each rank issues a subsequence of
the same global order, as the blocking version does, so ranks never wait on each other in
opposite orders. Unarmed (the default), hooks do nothing and ``sync`` reduces everything itself.
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
        # issue order of (group, bucket of slice refs): global order reversed (see module docstring)
        self.order: list[tuple[object, list[tuple[str, int | None, int, int]]]] = [
            (group, bucket) for group, refs in reversed(self.reduces)
            for bucket in reversed(self._buckets_of_refs(refs))]
        self._bucket_params = [{r[0] for r in bucket} for _, bucket in self.order]
        self._buckets_of_param: dict[str, list[int]] = {}
        for i, names in enumerate(self._bucket_params):
            for n in names:
                self._buckets_of_param.setdefault(n, []).append(i)
        self._expected = 0  # accumulations that make a gradient final; 0 = not armed
        self._counts: dict[str, int] = {}
        self._pending: list[int] = []
        self._launched: list[tuple[object, torch.Tensor, list[torch.Tensor]]] = []
        self._hooks = [params[n].register_post_accumulate_grad_hook(self._hook(n)) for n in self._buckets_of_param]

    def _buckets_of_refs(self, refs: list[tuple[str, int | None, int, int]]
                         ) -> list[list[tuple[str, int | None, int, int]]]:
        """``refs`` split like :meth:`_buckets` splits their views (sizes from parameter shapes)."""
        out: list[list[tuple[str, int | None, int, int]]] = [[]]
        size = 0
        for ref in refs:
            name, dim, _, length = ref
            p = self.params[name]
            n = p.numel() if dim is None else p.numel() // p.shape[dim] * length
            if out[-1] and size + n > self.bucket_numel:
                out.append([])
                size = 0
            out[-1].append(ref)
            size += n
        return out

    def arm(self, expected: int) -> None:
        """Reduce buckets during the coming backward passes: a gradient is final after ``expected``
        accumulations (the number of micro-batches this stage runs this step)."""
        self._expected = expected
        self._counts = dict.fromkeys(self._buckets_of_param, 0)
        self._pending = [len(names) for names in self._bucket_params]
        self._launched = []

    def _hook(self, name: str):  # type: ignore[no-untyped-def]
        def on_grad(_: torch.Tensor) -> None:
            if not self._expected:
                return
            self._counts[name] += 1
            if self._counts[name] != self._expected:
                return
            for i in self._buckets_of_param[name]:
                self._pending[i] -= 1
            self._launch_ready()
        return on_grad

    def _launch(self, i: int) -> None:
        group, refs = self.order[i]
        views = [self._view(*r) for r in refs]
        flat = torch.cat([v.reshape(-1).float() for v in views])
        work = dist.all_reduce(flat, group=group, async_op=True)  # type: ignore[arg-type]
        self._launched.append((work, flat, views))

    def _launch_ready(self, everything: bool = False) -> None:
        """Launch buckets in issue order while the next one is complete (or all, ``everything``)."""
        while len(self._launched) < len(self.order):
            i = len(self._launched)
            if not everything and self._pending[i] > 0:
                return
            self._launch(i)

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
        if not self._expected:
            self._launched = []
        self._launch_ready(everything=True)
        for work, flat, views in self._launched:
            work.wait()  # type: ignore[attr-defined]
            off = 0
            for v in views:
                n = v.numel()
                v.copy_(flat[off:off + n].view(v.shape))
                off += n
        self._launched, self._expected = [], 0
        for group, src, names in self.bcasts:
            views = [self._view(n, None, 0, 0) for n in names]
            for bucket in self._buckets(views):
                self._flat_collective(bucket, lambda t, g=group, s=src: dist.broadcast(t, src=s, group=g))

"""Cross-pipeline gradient synchronisation over finest-common slices (see :mod:`planner.layout`).

Each pipeline's gradients are already scaled by its share of the global tokens (the loss of every
micro-batch is divided by the *global* token count), so a plain SUM over pipelines gives the
gradient of the global mean loss — whatever the pipelines' batch sizes, micro-batch counts or
layouts. The local views of every sync group holding this rank are cut into flat buckets
(:func:`planner.flat_buckets.flat_parts`, shared with the ZeRO-1 state layout); each bucket is one
contiguous fp32 buffer, reduced by one collective on the group's communicator: an in-place
all-reduce, or under ZeRO-1 (``scatter=True``, :mod:`executor.parallel.zero`) a reduce-scatter into the
owner's chunk (:attr:`Bucket.out`). Then the leaders of TP stages broadcast the reduced replicated
gradients (norm scales) to their TP groups (not under ZeRO-1, which broadcasts updated weights).

No copies (:meth:`GradSync.arm`): before backward, every parameter whose local shard is one whole
view gets ``.grad`` = its slot of the bucket buffer (zeroed), so autograd accumulates the
micro-batches in place (``main_grad`` style) and the buffer is the collective's input as it
stands. A view that is only part of a shard (pipelines with different TP degrees), or a gradient
someone replaced (the hot switch installs its own), is copied into its slot at launch and, for
the all-reduce, back after the wait.

Overlap with backward: a post-accumulate-grad hook counts each parameter's accumulations; after the
``expected``-th (its last micro-batch) the parameter is final, and every bucket at the head of the
issue order whose parameters are all final is launched asynchronously. :meth:`sync` launches what
is left (in order) and waits for all. Unarmed, hooks do nothing and ``sync`` does everything.

Why the issue order cannot deadlock (NCCL included)
---------------------------------------------------
* **One global order.** :func:`planner.flat_buckets.reduce_order` sorts buckets by a key that depends
  only on the bucket (its first parameter's canonical index, its sync group, decayed or not, its
  index), and every owner of a group cuts the same buckets. So all buckets of the plan form one
  total order and each rank launches the subsequence it owns, strictly in that order (a ready
  bucket waits for the ones before it). On every sync communicator all members issue the same
  collectives in the same order, and across communicators no two ranks issue two shared buckets
  in opposite orders, so no cycle of waits can form.
* **Nothing waits on a bucket until all are launched.** Launches never block the compute stream
  (``async_op=True``); the first wait is in :meth:`sync`, after this rank has launched every
  bucket. A rank's launches depend only on its own backward, which depends only on p2p and TP
  traffic inside its pipeline, never on a sync group — so every member reaches every launch.
* **One traffic class per communicator, one issuing thread at a time.** Buckets go only to sync
  groups (:mod:`executor.parallel.groups`). They are issued from the backward hooks (the autograd thread)
  or from :meth:`sync` (the training thread, after ``backward`` returned), never both at once;
  when a sync group is also the plan's group (one rank per pipeline), the engine's statistics
  all-reduce follows :meth:`sync` on every rank, so its position in the order is the same too.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from executor.parallel.groups import ProcessGroups
from planner.flat_buckets import DEFAULT_BUCKET_NUMEL, FlatBucket, FlatPart, LocalView, flat_parts, reduce_order
from planner.layout import Topology

# torch >= 2.13 names the single-tensor collectives *_single (the *_tensor names warn there)
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

__all__ = ["DEFAULT_BUCKET_NUMEL", "Bucket", "GradSync", "all_gather_flat", "tp_broadcasts"]


@dataclass
class Bucket:
    """One flat bucket of this rank: where it lives, its gradient buffer while a step runs, and
    under ZeRO-1 the reduced chunk this rank owns."""

    group: Any  # the sync group's process group (None until GradSync.attach)
    part: int  # index into GradSync.parts
    index: int  # index into that part's buckets
    spec: FlatBucket
    grad: torch.Tensor | None = None  # [padded] fp32 while a step runs
    out: torch.Tensor | None = None  # ZeRO-1: [chunk] reduced gradient of the owned range
    work: Any = None
    names: set[str] = field(default_factory=set)


def tp_broadcasts(topology: Topology, rank: int) -> list[tuple[tuple[int, ...], int, list[str]]]:
    """(TP group ranks, source rank, parameter names) of every replicated-parameter broadcast of ``rank``."""
    return [(b.ranks, b.ranks[0], list(b.names)) for b in topology.tp_broadcasts if rank in b.ranks]


def narrow(t: torch.Tensor, v: LocalView) -> torch.Tensor:
    """``v``'s view of ``t`` (a local shard)."""
    return t if v.dim is None else t.narrow(v.dim, v.start, v.length)


def slot(buf: torch.Tensor, v: LocalView, off: int, shape: torch.Size) -> torch.Tensor:
    """``v``'s slot at ``off`` of the flat ``buf``, shaped like ``v``'s view of a shard of ``shape``."""
    sizes = list(shape)
    if v.dim is not None:
        sizes[v.dim] = v.length
    return buf[off:off + v.numel].view(sizes)


class GradSync:
    """The buckets of rank ``rank`` of ``topology`` (no process group needed); :meth:`attach` gives
    them their groups, before the first step (the elastic switch builds an engine before its
    plan's groups exist, :mod:`executor.switch.elastic_switch`)."""

    def __init__(self, topology: Topology, rank: int, params: dict[str, torch.nn.Parameter], *,
                 bucket_numel: int = DEFAULT_BUCKET_NUMEL, scatter: bool = False):
        self.params = params
        self.bucket_numel = bucket_numel
        self.scatter = scatter
        self.parts: list[FlatPart] = flat_parts(topology, rank, bucket_numel)
        # issue order (module docstring): buckets of this rank, latest parameters first
        self.order: list[Bucket] = [Bucket(None, i, j, self.parts[i].buckets[j]) for i, j in reduce_order(self.parts)]
        for b in self.order:
            b.names = {v.name for v in b.spec.views}
        self.bcast_specs = [] if scatter else tp_broadcasts(topology, rank)
        self.bcasts: list[tuple[object, int, list[str]]] = []
        self.attached = False
        self._buckets_of_param: dict[str, list[int]] = {}
        for i, b in enumerate(self.order):
            for n in b.names:
                self._buckets_of_param.setdefault(n, []).append(i)
        # rounds of at most this many elements per owner and collective (None: one per bucket);
        # a test knob (ZeroOptimizer.bucket_numel), the layout stays the planner's
        self.round_numel: int | None = None
        self._expected = 0  # accumulations that make a gradient final; 0 = not armed
        self._counts: dict[str, int] = {}
        self._pending: list[int] = []
        self._launched: list[Bucket] = []
        self.copies = 0  # views copied into a bucket so far (0 when every gradient was bound)
        self._hooks = [params[n].register_post_accumulate_grad_hook(self._hook(n)) for n in self._buckets_of_param]

    def attach(self, groups: ProcessGroups) -> None:
        """Give every bucket its sync group's communicator, and the broadcasts their TP groups."""
        handles = [groups.group(p.ranks) for p in self.parts]
        for b in self.order:
            b.group = handles[b.part]
        self.bcasts = [(groups.group(ranks), src, names) for ranks, src, names in self.bcast_specs]
        self.attached = True

    def _check_attached(self) -> None:
        if not self.attached:  # a None group is the default group to torch: a silently wrong reduction
            raise RuntimeError("GradSync has no process groups yet (attach them before the first step)")

    # ------------------------------------------------------------------------------ buffers
    def _allocate(self, bind: bool) -> None:
        """Fresh zeroed bucket buffers; with ``bind`` the whole-shard views become the ``.grad``."""
        for b in self.order:
            p0 = self.params[b.spec.views[0].name]
            size = b.spec.padded if self.scatter else b.spec.numel
            b.grad = torch.zeros(size, dtype=torch.float32, device=p0.device)
            b.out, b.work = None, None
            if bind:
                for v, off in zip(b.spec.views, b.spec.offsets):
                    if v.whole:
                        p = self.params[v.name]
                        p.grad = slot(b.grad, v, off, p.shape)

    def _gather_in(self, b: Bucket) -> None:
        """Copy every view whose gradient is not its slot already into the bucket buffer."""
        assert b.grad is not None
        for v, off in zip(b.spec.views, b.spec.offsets):
            p = self.params[v.name]
            assert p.grad is not None, f"no gradient for {v.name}"
            src, dst = narrow(p.grad, v), slot(b.grad, v, off, p.shape)
            if src.data_ptr() != dst.data_ptr():
                dst.copy_(src)
                self.copies += 1

    def _scatter_out(self, b: Bucket) -> None:
        """After an all-reduce: copy the reduced slots back where the gradient is not the slot."""
        assert b.grad is not None
        for v, off in zip(b.spec.views, b.spec.offsets):
            p = self.params[v.name]
            assert p.grad is not None
            dst, src = narrow(p.grad, v), slot(b.grad, v, off, p.shape)
            if src.data_ptr() != dst.data_ptr():
                dst.copy_(src)

    # ------------------------------------------------------------------------------ overlap
    def arm(self, expected: int) -> None:
        """Before the step's backward passes: bind the gradients to fresh bucket buffers and reduce
        buckets as they become final (a gradient is final after ``expected`` accumulations, the
        number of micro-batches this stage runs this step)."""
        self._check_attached()
        self._allocate(bind=True)
        self._expected = expected
        self._counts = dict.fromkeys(self._buckets_of_param, 0)
        self._pending = [len(b.names) for b in self.order]
        self._launched = []

    def _hook(self, name: str):  # type: ignore[no-untyped-def]
        """The hook holds this object weakly: a parameter's hook lives in C++, outside the garbage
        collector's view, so a strong reference made parameter -> hook -> GradSync -> parameters
        a cycle never freed (every dropped Engine kept its weights and gradient buckets: ~10 GiB
        per 1.3B plan on 4x H200, the fidelity benchmark's runs of 2026-11-26)."""
        ref = weakref.ref(self)

        def on_grad(_: torch.Tensor) -> None:
            sync = ref()
            if sync is not None:
                sync._on_grad(name)
        return on_grad

    def _on_grad(self, name: str) -> None:
        if not self._expected:
            return
        self._counts[name] += 1
        if self._counts[name] != self._expected:
            return
        for i in self._buckets_of_param[name]:
            self._pending[i] -= 1
        self._launch_ready()

    def _launch(self, b: Bucket) -> None:
        self._gather_in(b)
        assert b.grad is not None
        if not self.scatter:
            b.work = dist.all_reduce(b.grad, group=b.group, async_op=True)  # type: ignore[arg-type]
        else:
            c, k = b.spec.chunk, b.spec.k
            b.out = torch.empty(c, dtype=torch.float32, device=b.grad.device)
            step = c if self.round_numel is None else max(1, min(c, self.round_numel))
            if step == c:
                b.work = _reduce_scatter(b.out, b.grad, group=b.group, async_op=True)
            else:  # rounds: lists of views (the backend flattens them itself)
                b.work = [dist.reduce_scatter(b.out[r0:r0 + min(step, c - r0)],
                                              [b.grad[j * c + r0:j * c + r0 + min(step, c - r0)] for j in range(k)],
                                              group=b.group, async_op=True) for r0 in range(0, c, step)]
        self._launched.append(b)

    def _launch_ready(self, everything: bool = False) -> None:
        """Launch buckets in issue order while the next one is complete (or all, ``everything``)."""
        while len(self._launched) < len(self.order):
            i = len(self._launched)
            if not everything and self._pending[i] > 0:
                return
            self._launch(self.order[i])

    # ------------------------------------------------------------------------------ sync
    def sync(self) -> None:
        """SUM-reduce every bucket among its owners (launching what the hooks have not), wait for
        all; then, without ZeRO-1, broadcast replicated gradients in TP groups."""
        self._check_attached()
        if not self._expected:  # unarmed: the gradients are wherever autograd (or a caller) put them
            self._allocate(bind=False)
            self._launched = []
        with torch.no_grad():
            self._launch_ready(everything=True)
            for b in self._launched:
                for w in b.work if isinstance(b.work, list) else [b.work]:
                    w.wait()
                b.work = None
                if not self.scatter:
                    self._scatter_out(b)
            self._launched, self._expected = [], 0
            if not self.scatter:  # the bound gradients keep their buffers; the rest is copied back
                self.release()
            for group, src, names in self.bcasts:
                grads = [self.params[n].grad for n in names]
                flat = torch.cat([g.reshape(-1) for g in grads])  # type: ignore[union-attr]
                dist.broadcast(flat, src=src, group=group)  # type: ignore[arg-type]
                torch._foreach_copy_(grads, [t.view_as(g) for t, g in  # type: ignore[arg-type]
                                             zip(flat.split([g.numel() for g in grads]), grads)])  # type: ignore[union-attr]

    def release(self) -> None:
        """Drop the bucket buffers (after the all-reduce; ZeRO-1 once the reduced chunks are taken)."""
        for b in self.order:
            b.grad, b.out, b.work = None, None, None

"""torch.distributed process groups for a :class:`~planner.layout.Topology`, created and
connected before the first step.

``ProcessGroups.create`` is collective over the default group: every rank (including ranks beyond
the plan's world size, which some tests use to run small plans in a large worker pool) calls
``new_group`` for the same rank sets in the same order — the plan's ranks, every TP group, every
gradient-sync group and TP-broadcast group (deduplicated, in topology order), then one *dedicated*
group per CP group of a ``cp > 1`` stage (its K/V all-gathers inside attention, never shared with
the gradient traffic of an equal rank set), then one *dedicated* group per stage boundary
(``Topology.p2p_pairs``; one per pair of CP-slot leaders that exchange tokens). Sets of one rank get no group (their
collectives are no-ops). Then :meth:`ProcessGroups.connect` runs one tiny operation on every group,
in that same global order, so every communicator exists and is connected before training starts.

Why NCCL needs all of this (gloo does not)
------------------------------------------
NCCL creates a communicator, and later the connections of each ring and each p2p pair, *lazily*,
on the first operation that needs it, and that set-up blocks the host until every member arrives
at the same point. Found on 4 GPUs: (1) ``batch_isend_irecv`` on a group whose communicator does
not exist yet builds the communicator of the *whole* group, so a pipeline's first send between
two stage leaders on the default group waited for every rank of the job — while a TP follower
waited in its first broadcast for its leader, or a one-stage pipeline waited in its first
gradient all-reduce (inside a backward hook) for a rank of another pipeline: deadlock. (2) A first
operation issued inside an autograd hook can block a backward pass on a peer's set-up.

The rule that makes every plan deadlock-free on NCCL:

1. **Set-up in one global order.** Every communicator is created (``device_id`` given to
   ``init_process_group``, so ``new_group`` splits it off eagerly; gradient-sync groups share the
   default communicator's resources, :mod:`executor.parallel.split_share`) and connected (:meth:`connect`)
   by all ranks walking the same list in the same order; each rank takes part in the entries it
   belongs to. The first unfinished entry of that list always has all its members at it, so the
   walk cannot deadlock. After it, no operation ever waits for a peer's set-up.
2. **One traffic class per communicator.** Each stage boundary has its own two-rank group used by
   nothing but that boundary's p2p; a TP group carries only its stage's collectives (issued in the
   same program order by all its ranks); sync groups carry only gradient reduction / ZeRO traffic
   (issued in the topology's global order, :mod:`executor.parallel.grad_sync`). NCCL runs one
   communicator's operations in issue order on each rank, so two traffic classes sharing one could
   be ordered differently on two ranks (an asynchronous gradient bucket before a p2p send on one,
   after it on the other) and wait on each other forever.
3. **Stream order equals program order.** Every operation whose result is used is waited on the
   compute stream (``work.wait()``: host-blocking on gloo, stream-blocking on NCCL) before the next
   dependent operation is issued, so each rank's device executes its blocking operations in program
   order — exactly the order whose deadlock-freedom the schedules argue for gloo
   (:mod:`executor.parallel.schedules`, :mod:`executor.parallel.p2p`). The only operations left running in the
   background are on sync groups: gradient buckets (waited in :meth:`GradSync.sync`) and ZeRO-1's
   weight all-gathers (waited by the next forward, :meth:`executor.parallel.zero.ZeroOptimizer.ready`),
   each launched by every member in one global order (:mod:`executor.parallel.grad_sync`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from executor.parallel.group_release import distinct, release
from executor.parallel.split_share import shared_sets, split_share_options
from planner.layout import StageTopo, Topology


@dataclass
class ProcessGroups:
    topology: Topology
    rank: int  # this process's global rank
    world: Any  # group of the plan's ranks (None if this rank is not in the plan)
    by_ranks: dict[tuple[int, ...], Any] = field(default_factory=dict)
    p2p: dict[tuple[int, int], Any] = field(default_factory=dict)  # (leader, next leader) -> its own group
    cp: dict[tuple[int, ...], Any] = field(default_factory=dict)  # CP group ranks -> its own group
    # every (kind, ranks, group) in creation order: the global order of set-up (see the module docstring)
    order: list[tuple[str, tuple[int, ...], Any]] = field(default_factory=list)
    setup_s: float = 0.0  # seconds to create and connect every group
    device_mib: float = 0.0  # device memory the communicators took outside PyTorch's allocator (CUDA)

    @property
    def in_plan(self) -> bool:
        return self.rank < self.topology.world_size

    @property
    def stage(self) -> StageTopo:
        return self.topology.stage_of(self.rank)

    @property
    def tp_group(self) -> Any:
        return self.group(self.stage.ranks)

    @property
    def tp_rank(self) -> int:
        return self.stage.ranks.index(self.rank)

    @property
    def cp_group(self) -> Any:
        """This rank's CP group (the same TP rank of every CP slot of its stage; None when cp == 1)."""
        return self.cp.get(self.stage.cp_group(self.tp_rank))

    def group(self, ranks: tuple[int, ...]) -> Any:
        """The group of exactly ``ranks`` (None for a single rank)."""
        if len(ranks) == 1:
            return None
        return self.by_ranks[tuple(ranks)]

    def boundary(self, a: int | None, b: int | None) -> Any:
        """The p2p group of the stage boundary between leaders ``a`` and ``b`` (either order; None
        when there is no such boundary)."""
        if a is None or b is None:
            return None
        return self.p2p.get((a, b), self.p2p.get((b, a)))

    @classmethod
    def create(cls, topology: Topology, backend: str | None = None, *, connect: bool = True) -> ProcessGroups:
        """Create (and, with ``connect``, connect) every group of ``topology``: collective over the
        default group. ``backend`` defaults to the default group's backend."""
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised (init_process_group first)")
        size = dist.get_world_size()
        if size < topology.world_size:
            raise RuntimeError(f"the plan needs {topology.world_size} ranks, torch.distributed has {size}")
        rank = dist.get_rank()
        backend = backend or dist.get_backend()
        t0, free0 = time.perf_counter(), _free_mib()
        plan_ranks = tuple(range(topology.world_size))
        out = cls(topology=topology, rank=rank, world=None)
        share = shared_sets(topology)
        for kind, ranks in group_sets(topology):
            if kind == "collective" and ranks == plan_ranks and size == topology.world_size:
                out.by_ranks[ranks] = dist.group.WORLD
                out.order.append((kind, ranks, dist.group.WORLD))
                continue
            # fresh options per group: new_group writes the group's name and ranks into them
            opts = split_share_options() if ranks in share else None  # executor.parallel.split_share
            group = dist.new_group(list(ranks), backend=backend, pg_options=opts)
            if kind == "p2p":
                out.p2p[(ranks[0], ranks[1])] = group
            elif kind == "cp":
                out.cp[ranks] = group
            else:
                out.by_ranks[ranks] = group
            out.order.append((kind, ranks, group))
        if size == topology.world_size:
            world: Any = dist.group.WORLD
        elif len(plan_ranks) == 1:
            world = None
        else:
            world = out.by_ranks[plan_ranks]
        out.world = world if rank < topology.world_size else None
        if connect:
            out.connect()
        out.setup_s, out.device_mib = time.perf_counter() - t0, free0 - _free_mib()
        return out

    def members(self) -> int:
        """How many of the communicators this rank belongs to (the default group included)."""
        return sum(1 for _, ranks, _ in self.order if self.rank in ranks)

    def device(self) -> torch.device:
        """Where this backend's tensors live: the current CUDA device under NCCL, else the CPU."""
        if dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def connect(self) -> None:
        """One tiny operation on every group this rank belongs to, in the global order of
        :attr:`order` (module docstring, rule 1): an all-reduce on collective groups, a batched
        send + receive in both directions on p2p groups. Then wait for the device."""
        device = self.device()
        for kind, ranks, group in self.order:
            if self.rank not in ranks:
                continue
            if kind != "p2p":
                dist.all_reduce(torch.ones(1, device=device), group=group)
                continue
            peer = ranks[1] if ranks[0] == self.rank else ranks[0]
            out, back = torch.ones(1, device=device), torch.empty(1, device=device)
            for req in dist.batch_isend_irecv([dist.P2POp(dist.isend, out, peer, group=group),
                                               dist.P2POp(dist.irecv, back, peer, group=group)]):
                req.wait()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def close(self) -> None:
        """Destroy every group created here (not the default group), in parallel
        (:mod:`executor.parallel.group_release`). Collective: every rank calls it after the last operation on
        these groups."""
        dist.barrier()  # every member is past its last operation on these groups
        if dist.get_backend() == "nccl":
            torch.cuda.synchronize()
        release(self.hand_over())

    def hand_over(self) -> list[Any]:
        """Every group created here (not the default group), forgotten by this object: the caller
        destroys them (:meth:`close`; the elastic switch retires them, :mod:`executor.parallel.group_retire`)."""
        out = distinct(group for _, _, group in self.order)
        self.by_ranks.clear()
        self.p2p.clear()
        self.cp.clear()
        self.order.clear()
        return out


def group_sets(topology: Topology) -> list[tuple[str, tuple[int, ...]]]:
    """Every communicator of ``topology`` as ``(kind, ranks)`` in the global creation order (pure):
    the plan's ranks, TP groups, gradient-sync and TP-broadcast groups (equal rank sets once),
    then one ``cp`` group per CP group and one ``p2p`` group per stage boundary (never shared).
    Sets of one rank get none."""
    plan_ranks = tuple(range(topology.world_size))
    wanted = [plan_ranks, *topology.tp_groups(), *(g.ranks for g in topology.sync_groups),
              *(b.ranks for b in topology.tp_broadcasts)]
    out: list[tuple[str, tuple[int, ...]]] = []
    seen: set[tuple[int, ...]] = set()
    for ranks in wanted:
        if len(ranks) > 1 and ranks not in seen:
            seen.add(ranks)
            out.append(("collective", ranks))
    cps = [("cp", st.cp_group(t)) for pipe in topology.pipelines for st in pipe if st.cp > 1 and st.cp_rank == 0
           for t in range(st.tp)]
    return out + cps + [("p2p", pair) for pair in topology.p2p_pairs()]


def _free_mib() -> float:
    """Free device memory of the current CUDA device under NCCL (0 elsewhere)."""
    if dist.get_backend() != "nccl":
        return 0.0
    return torch.cuda.mem_get_info()[0] / 2**20

"""The job's default process group, re-created when its membership changes (elastic training).

Neither gloo nor NCCL lets a process join or leave a communicator, so a job whose devices change
runs in *epochs*: each epoch's default group holds exactly its processes, ranked by the epoch's
plan (plan rank order, the contract every other module relies on). :class:`World` remembers the
current members (device ids in rank order) and, when asked to :meth:`World.enter` another member
list, leaves the current default group and initialises a new one on a fresh prefix of the job's
TCPStore, so keys of one epoch never meet another's. A member list equal to the current one keeps
the group (no set-up at all). Processes outside the new list leave and hold no group.

Leaving is one of two things. Inside an elastic switch the old group is *retired*
(:mod:`executor.parallel.group_retire`): detached from torch, alive, unused, and destroyed by its members
after the new plan's first step — destroying an NCCL communicator costs 300-500 ms, which the
switch no longer waits for. At the job's end it is destroyed (:meth:`World.leave`).

Every member connects to every other on the group (:meth:`World.connect_all`: one ping batch) where
the elastic job knows nothing is in flight — at start-up and at each switch's retire point — so
that the next switch that keeps this group (no device joins: it exchanges on it) finds its pairs
connected: NCCL connects two ranks inside their first point-to-point call, 1.2 s of a switch on
4x H200 under MPS (benchmarks/executor/elastic.py, 2026-11-26). Not above
:data:`PAIRS_AHEAD_MAX` members: NCCL keeps buffers for every connected peer (MiBs per channel).

Before creating a group, its members meet on the store (``wait_s``), so that the set-up's time
(``setup_s``) is its own, not the wait for the last member to arrive.

On CUDA the new group is bound to this process's device (``device_id``), so NCCL creates the
communicator eagerly, as at start-up (:func:`executor.train.setup.init_process_group`).

Before a group is destroyed, its members meet on the store (:meth:`World.settle`, or the retired
group's own meeting), not on the group: a process that finished its last operation must not close
its connections while a peer is still reading its part of that operation from them (on gloo, under
load, that peer failed with "Connection closed by peer", and the next group's set-up with it).
Retiring closes nothing, so it needs no meeting of its own.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from executor.parallel.group_release import release, subgroups
from executor.parallel.group_retire import Retired
from executor.parallel.store_meet import meet

PAIRS_AHEAD_MAX = 8  # World.connect_all connects every pair up to this many members (module docstring)


def ping(peers: list[int], device: torch.device) -> None:
    """One element to and from each of ``peers`` (ranks of the default group), all in one batch, and
    wait for them: connects the pairs on NCCL (:mod:`executor.switch.state_move`, step 3). Every
    peer must post its own batch holding this process."""
    if not peers:
        return
    out = torch.ones(1, device=device)
    ops = []
    for peer in peers:
        ops += [dist.P2POp(dist.isend, out, peer), dist.P2POp(dist.irecv, torch.empty(1, device=device), peer)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()


class World:
    def __init__(self, store: Any, prefix: str, device: torch.device, me: str, *, timeout_s: float = 1800.0):
        self.store = store
        self.prefix = prefix
        self.device = device
        self.me = me
        self.timeout_s = timeout_s
        self.backend = "nccl" if device.type == "cuda" else "gloo"
        self.members: tuple[str, ...] = ()
        self.tag = "initial"  # store prefix of the current group (unique per group of the job)
        self.setup_s = 0.0  # seconds the last enter() spent creating the group
        self.leave_s = 0.0  # seconds the last enter() spent leaving (or retiring) the previous one
        self.wait_s = 0.0  # seconds the last enter() waited on the store for the new group's last member

    @property
    def rank(self) -> int:
        return self.members.index(self.me)

    def adopt(self, members: Sequence[str]) -> None:
        """Take over a default group somebody else initialised with ``members`` in rank order."""
        if not dist.is_initialized() or dist.get_world_size() != len(members):
            raise RuntimeError(f"no default process group of {len(members)} ranks to adopt")
        self.members = tuple(members)
        self.tag = "adopted"

    def settle(self, name: str, count: int | None = None) -> None:
        """Wait on the store until every member of the current group (``count`` processes) has
        called this with the same ``name``; a member that never comes is an error after the timeout."""
        n = count if count is not None else len(self.members)
        meet(self.store, f"{self.prefix}/{self.tag}/settle/{name}", n, timeout_s=self.timeout_s, who=self.me)

    def enter(self, members: Sequence[str], tag: str, retire: list[Retired] | None = None) -> bool:
        """Make the default group ``members`` (in rank order; ``tag`` names the store prefix, unique
        per group of the job). Returns whether this process is a member. With ``retire``, a current
        group is not destroyed but retired, appended to that list (module docstring)."""
        members = tuple(members)
        if len(set(members)) != len(members):
            raise ValueError(f"members listed twice: {members}")
        self.setup_s = self.leave_s = self.wait_s = 0.0
        if members == self.members and dist.is_initialized():
            return True
        t0 = time.perf_counter()
        if retire is not None and dist.is_initialized():
            retire.append(self.retire())
        else:
            self.leave()
        self.leave_s = time.perf_counter() - t0
        if self.me not in members:
            return False
        t0 = time.perf_counter()
        meet(self.store, f"{self.prefix}/{tag}/arrive", len(members), timeout_s=self.timeout_s, who=self.me)
        t1 = time.perf_counter()
        self.wait_s = t1 - t0
        if self.device.type == "cuda":  # a joining process never ran init_process_group's set-up
            torch.cuda.set_device(self.device)
        dist.init_process_group(self.backend, store=dist.PrefixStore(f"{self.prefix}/{tag}", self.store),
                                rank=members.index(self.me), world_size=len(members),
                                timeout=timedelta(seconds=self.timeout_s),
                                device_id=self.device if self.device.type == "cuda" else None)
        self.members, self.tag = members, tag
        self.setup_s = time.perf_counter() - t1
        return True

    def connect_all(self) -> float:
        """Connect every pair of members (module docstring); collective over the members, where
        nothing is in flight on the group. Returns the seconds (0 above :data:`PAIRS_AHEAD_MAX`)."""
        if len(self.members) > PAIRS_AHEAD_MAX:
            return 0.0
        t0 = time.perf_counter()
        ping([r for r in range(len(self.members)) if r != self.rank], self.device)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - t0

    def times(self) -> dict[str, float]:
        """The last :meth:`enter`'s seconds by part (as :class:`executor.switch.state_move.SwitchStats` names them)."""
        return {"world_setup_s": self.setup_s, "leave_s": self.leave_s, "world_wait_s": self.wait_s}

    def retire(self) -> Retired:
        """Detach the default group (and any group split off it), alive until the returned
        :class:`Retired` is released by every member of it."""
        retired = Retired.take_world(store=self.store, key=f"{self.prefix}/{self.tag}/retire", device=self.device,
                                     who=self.me, timeout_s=self.timeout_s)
        self.members = ()
        return retired

    def leave(self) -> None:
        """Destroy the default group (and every group split off it), if any."""
        if dist.is_initialized():
            if self.backend == "nccl":
                torch.cuda.synchronize(self.device)
            self.settle("leave", len(self.members) or dist.get_world_size())
            release(subgroups())  # in parallel: destroying the default group would close them one by one
            dist.destroy_process_group()
        self.members = ()

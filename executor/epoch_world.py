"""The job's default process group, re-created when its membership changes (elastic training).

Neither gloo nor NCCL lets a process join or leave a communicator, so a job whose devices change
runs in *epochs*: each epoch's default group holds exactly its processes, ranked by the epoch's
plan (plan rank order, the contract every other module relies on). :class:`World` remembers the
current members (device ids in rank order) and, when asked to :meth:`World.enter` another member
list, destroys the current default group and initialises a new one on a fresh prefix of the job's
TCPStore, so keys of one epoch never meet another's. A member list equal to the current one keeps
the group (no set-up at all). Processes outside the new list leave and hold no group.

On CUDA the new group is bound to this process's device (``device_id``), so NCCL creates the
communicator eagerly, as at start-up (:func:`executor.train_setup.init_process_group`).

Before a group is destroyed, its members meet on the store (:meth:`World.settle`), not on the group:
a process that finished its last operation must not close its connections while a peer is still
reading its part of that operation from them (on gloo, under load, that peer failed with
"Connection closed by peer", and the next group's set-up with it).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from executor.group_release import release, subgroups
from executor.store_meet import meet


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
        self.leave_s = 0.0  # seconds the last enter() spent leaving the previous one

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

    def enter(self, members: Sequence[str], tag: str) -> bool:
        """Make the default group ``members`` (in rank order; ``tag`` names the store prefix, unique
        per group of the job). Returns whether this process is a member."""
        members = tuple(members)
        if len(set(members)) != len(members):
            raise ValueError(f"members listed twice: {members}")
        if members == self.members and dist.is_initialized():
            self.setup_s = self.leave_s = 0.0
            return True
        t0 = time.perf_counter()
        self.leave()
        self.leave_s = time.perf_counter() - t0
        if self.me not in members:
            return False
        t0 = time.perf_counter()
        if self.device.type == "cuda":  # a joining process never ran init_process_group's set-up
            torch.cuda.set_device(self.device)
        dist.init_process_group(self.backend, store=dist.PrefixStore(f"{self.prefix}/{tag}", self.store),
                                rank=members.index(self.me), world_size=len(members),
                                timeout=timedelta(seconds=self.timeout_s),
                                device_id=self.device if self.device.type == "cuda" else None)
        self.members, self.tag = members, tag
        self.setup_s = time.perf_counter() - t0
        return True

    def leave(self) -> None:
        """Destroy the default group (and every group split off it), if any."""
        if dist.is_initialized():
            if self.backend == "nccl":
                torch.cuda.synchronize(self.device)
            self.settle("leave", len(self.members) or dist.get_world_size())
            release(subgroups())  # in parallel: destroying the default group would close them one by one
            dist.destroy_process_group()
        self.members = ()

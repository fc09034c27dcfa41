"""The old plan's process groups and the old default groups after an elastic switch: retired inside
the switch, destroyed after the new plan's first step.

Why: destroying an NCCL communicator costs a fixed 300-370 ms whatever it carried
(``benchmarks/executor/group_teardown.py``), and closing the old plan's groups was 65-530 ms of
each switch on 4x H200, destroying the old world another 119-487 ms (benchmarks/executor/elastic.py,
2026-11-26) — before the new plan could run its first step.

1. **Retire** (in :func:`executor.switch.state_move.switch`, after the old engine drained its last
   collectives): the groups are *detached* — removed from torch.distributed's registry, the
   book-keeping half of ``destroy_process_group(g)`` without its ``shutdown()`` — and kept alive,
   unused. Nothing resolves them any more, and no later ``destroy_process_group()`` (which shuts
   down every group torch knows) touches them.
2. **Release** at the *retire point*, the step boundary after the new plan's first step
   (:mod:`executor.switch.elastic_switch`): the engine drains, the device is synchronised, every process
   that held them (every device of the old plan, or of the old world) meets the others on the
   store, and each group is shut down in its own thread (:mod:`executor.parallel.group_release`); the next
   step starts once all are.

Why at a step boundary and not in a thread beside the first step: NCCL's destroy waits on its
streams and frees device memory, and a CUDA call that waits for the device while an NCCL kernel
of another communicator waits for a peer — whose host may be stuck in the same kind of call — is
the deadlock NCCL's documentation warns about for concurrent communicators; gloo would pass it,
GPUs could hang. At the retire point nothing is in flight on this process's device, the main
thread issues nothing until every destroy returned, and every member destroys the same groups
after meeting the others: the destroy ``ProcessGroups.close`` did, with the same guarantees, one
step later. Its cost is still paid — off the switch's critical path, on the job's (the second
step waits for it) — and reported as ``retire_s``.

The old **default group** (the world of :mod:`executor.switch.epoch_world`) is retired the same way when
the switch changes it (:func:`detach_world`): torch holds one default group, so it is detached as
a whole — the default slot emptied, a new world can be initialised beside it — and released by
its own members (a :class:`Retired` of its own, counting them). Detaching resets torch's group
counter, as ``destroy_process_group()`` does: the next world's groups are named (and set up under
store prefixes) by that count, and a process joining the new world starts it at 0 — a staying
process that did not reset it would name the same group differently and their set-up would hang.

A leaving process (not in the new plan) releases its retired groups at the end of the switch: it
meets the other holders at their retire point (it waits for their first step), so every member
destroys each group at the same point, then exits.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed import distributed_c10d as c10d

from executor.parallel.group_release import distinct, in_parallel, subgroups
from executor.parallel.store_meet import meet


def detach(pg: Any) -> None:
    """Remove ``pg`` (not the default group) from torch.distributed's registry without shutting it
    down: what ``destroy_process_group(pg)`` does besides ``pg.shutdown()``. The caller keeps it
    alive and shuts it down later (:func:`shut_down`)."""
    w = c10d._world
    if pg is w.default_pg or pg not in w.pg_map:
        raise ValueError(f"not a registered process group other than the default: {pg!r}")
    _unlist(pg)


def detach_world() -> list[Any]:
    """Detach the default group and every group still registered beside it (normally none: the old
    plan's were retired first); returns them, the default group last. torch is then uninitialised,
    as after ``destroy_process_group()``, with its group counter reset (module docstring)."""
    w = c10d._world
    world = w.default_pg
    if world is None:
        raise ValueError("no default process group to detach")
    rest = subgroups()
    for g in rest:
        detach(g)
    _unlist(world)
    c10d._update_default_pg(None)
    w.group_count = 0
    return [*rest, world]


def _unlist(pg: Any) -> None:
    """``pg`` out of every table of torch.distributed's registry."""
    w = c10d._world
    name = pg.group_name
    for table in (w.pg_map, w.pg_names, w.pg_group_ranks, w.pg_backend_config, w.pg_coalesce_state, w.pg_to_tag,
                  getattr(w, "pg_default_device", {})):
        table.pop(pg, None)
    for members in w.tags_to_pg.values():
        while any(m is pg for m in members):
            members.remove(pg)
    c10d._unregister_process_group(name)


def shut_down(pg: Any) -> None:
    """Destroy a detached group's communicators (``destroy_process_group``'s own call)."""
    if type(pg) is c10d.ProcessGroup and pg._has_hooks():
        pg._wait_for_pending_works()
    pg.shutdown()


@dataclass
class Retired:
    """Groups of an old plan or an old default group, detached and alive until :meth:`release`
    (module docstring)."""

    groups: list[Any]
    store: Any
    key: str  # the store key every holder meets on (unique per switch of the job)
    count: int  # how many processes hold these groups: all of them meet before the destroy
    device: torch.device
    who: str
    timeout_s: float
    retire_s: float | None = None  # seconds the release took, once done

    @classmethod
    def take(cls, groups: Iterable[Any], *, store: Any, key: str, count: int, device: torch.device, who: str,
             timeout_s: float) -> Retired:
        """Detach ``groups`` (``None``, non-member entries and the default group are skipped)."""
        todo = distinct(groups)
        for g in todo:
            detach(g)
        return cls(todo, store, key, count, device, who, timeout_s)

    @classmethod
    def take_world(cls, *, store: Any, key: str, device: torch.device, who: str, timeout_s: float) -> Retired:
        """Detach the default group (:func:`detach_world`); every one of its members holds it."""
        groups = detach_world()
        return cls(groups, store, key, groups[-1].size(), device, who, timeout_s)

    @property
    def pending(self) -> bool:
        return self.retire_s is None

    def release(self) -> float:
        """Collective over the :attr:`count` holders: meet, then destroy every group in parallel
        (once; later calls return the first one's seconds). Call it where nothing is in flight on
        this process's communicators (the engine drained)."""
        if self.retire_s is not None:
            return self.retire_s
        t0 = time.perf_counter()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        meet(self.store, self.key, self.count, timeout_s=self.timeout_s, who=self.who)
        in_parallel(shut_down, self.groups)
        self.groups.clear()
        self.retire_s = time.perf_counter() - t0
        return self.retire_s

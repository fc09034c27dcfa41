"""Destroying process groups in parallel.

Measured on 4x H200 (NCCL 2.28, ``benchmarks/executor/group_teardown.py``): destroying one NCCL
communicator takes 300-500 ms, the same after one element or 256 MiB of traffic — a fixed cost
per communicator, which ``destroy_process_group`` pays group after group. Destroying each group in
its own thread overlaps those costs: in the elastic benchmark on the same machine, closing the old
plan's groups fell from 0.70-0.82 s to 0.38-0.45 s for the same events (benchmarks/executor/elastic.py,
2026-11-26). The elastic job closes groups this way: those the switch
retired (the old plan's and the worlds left) after the new plan's first step
(:mod:`executor.parallel.group_retire`), its last world at its end (:meth:`executor.switch.epoch_world.World.leave`).

Every member must be past its last operation on these groups before they are released (the
callers meet on a barrier or on the store first).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d


def release(groups: Iterable[Any]) -> None:
    """Destroy ``groups`` (not the default group; ``None`` and non-member entries are skipped), each
    in its own thread; returns once every one is destroyed, raising the first failure."""
    in_parallel(dist.destroy_process_group, distinct(groups))


def distinct(groups: Iterable[Any]) -> list[Any]:
    """``groups`` once each, without ``None``, non-member entries and the default group."""
    todo: list[Any] = []
    for g in groups:
        if g is None or g is dist.GroupMember.NON_GROUP_MEMBER or g is dist.group.WORLD:
            continue
        if all(g is not t for t in todo):
            todo.append(g)
    return todo


def in_parallel(destroy: Callable[[Any], None], groups: list[Any]) -> None:
    """``destroy(g)`` for every group, each in its own thread (one group: on this thread); returns
    once every call returned, raising the first failure."""
    if len(groups) < 2:
        for g in groups:
            destroy(g)
        return
    errors: list[BaseException] = []

    def one(g: Any) -> None:
        try:
            destroy(g)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(g,), name="hexiscale-release", daemon=True) for g in groups]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def subgroups() -> list[Any]:
    """Every process group of this process other than the default group."""
    world = dist.group.WORLD
    return [g for g in list(c10d._world.pg_map) if g is not world]

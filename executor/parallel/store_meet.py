"""A meeting of processes on the job's TCPStore, not on a process group.

Used where a group is about to be destroyed (:meth:`executor.switch.epoch_world.World.settle`,
:meth:`executor.parallel.group_retire.Retired.release`): meeting on the group itself would be one more
operation on it, and a process that finished its last operation must not close its connections
while a peer is still reading its part of that operation. Also before a default group is created
(:meth:`executor.switch.epoch_world.World.enter`), so that its set-up is timed apart from the wait
for its last member.

The last process to arrive sets a key the others wait on (``store.wait``), so they leave at once
instead of on their next poll.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch.distributed as dist


def meet(store: Any, key: str, count: int, *, timeout_s: float, who: str) -> None:
    """Wait until ``count`` processes have called this with ``key`` (each call counts once); a
    process that never comes is an error after ``timeout_s``."""
    if int(store.add(key, 1)) >= count:
        store.set(f"{key}/all", "1")
    try:
        store.wait([f"{key}/all"], timedelta(seconds=timeout_s))
    except dist.DistStoreError:
        raise RuntimeError(f"{who}: not every one of {count} processes reached {key} in {timeout_s:.0f} s") from None

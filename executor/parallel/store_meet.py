"""A meeting of processes on the job's TCPStore, not on a process group.

Used where a group is about to be destroyed (:meth:`executor.switch.epoch_world.World.settle`,
:meth:`executor.parallel.group_retire.Retired.release`): meeting on the group itself would be one more
operation on it, and a process that finished its last operation must not close its connections
while a peer is still reading its part of that operation.
"""

from __future__ import annotations

import time
from typing import Any


def meet(store: Any, key: str, count: int, *, timeout_s: float, who: str) -> None:
    """Wait until ``count`` processes have called this with ``key`` (each call counts once); a
    process that never comes is an error after ``timeout_s``."""
    store.add(key, 1)
    deadline = time.monotonic() + timeout_s
    while int(store.add(key, 0)) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{who}: not every one of {count} processes reached {key} in {timeout_s:.0f} s")
        time.sleep(0.002)

"""A joining process's one-off NCCL start-up, paid before it reports ready (beside
:mod:`executor.switch.warm_up`, which pays the training kernels' first uses).

The first NCCL communicator a process creates pays, once per process, what later ones do not:
loading the library and its network plugins, probing the network devices, NVML's start and the
bootstrap's interface discovery. In an elastic join that first communicator is the new world's,
created inside the switch (:meth:`executor.switch.epoch_world.World.enter`), and every member
waits for the joiner there: 425 ms of ``world_setup_s`` on the 4x H100 join of 2026-11-27 09:31,
against 34-50 ms for the leaves' worlds, whose processes were warm.

:func:`warm_nccl` creates a one-rank NCCL communicator on a private store (no default group, nothing
another process sees), eagerly (``eager_connect_single_device``, what ``init_process_group(...,
device_id=...)`` does for the world), and shuts it down. Whether that takes the
one-off share of the world's set-up off the switch is for the GPU run to show
(``tests/gpu/test_nccl_warm_gpu.py`` checks that a process group created afterwards works;
``python -m benchmarks.executor.elastic --elastic-only`` times the join's ``world_setup_s``). A
warm-up that fails only logs why: the world's set-up then pays, as before.
"""

from __future__ import annotations

import logging
import time

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


def warm_nccl(device: torch.device) -> float | None:
    """NCCL's one-off start-up on ``device`` (module docstring); the seconds it took, or None where
    there is nothing to warm (not a CUDA device, no NCCL) or it failed (logged)."""
    if device.type != "cuda" or not dist.is_nccl_available():
        return None
    t0 = time.perf_counter()
    try:
        torch.cuda.set_device(device)
        pg = dist.ProcessGroupNCCL(dist.HashStore(), 0, 1, dist.ProcessGroupNCCL.Options())
        try:
            pg.eager_connect_single_device(device)  # ncclCommInitRank now, as a device-bound world's
            torch.cuda.synchronize(device)
        finally:
            stop = getattr(pg, "shutdown", None) or getattr(pg, "abort", None)
            if stop is not None:
                stop()
    except Exception as exc:  # noqa: BLE001 - the warm-up only saves time; the job must not depend on it
        log.warning("NCCL warm-up failed (%s: %s); the switch's world set-up pays it", type(exc).__name__, exc)
        return None
    return time.perf_counter() - t0

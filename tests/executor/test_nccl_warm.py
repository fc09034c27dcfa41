"""The joiner's NCCL warm-up (executor.switch.nccl_warm) on a CPU: nothing to warm, nothing made —
no process group (the joiner's default group is the new world's, created in the switch). Its GPU
half is tests/gpu/test_nccl_warm_gpu.py."""

from __future__ import annotations

import torch
import torch.distributed as dist

from executor.switch.nccl_warm import warm_nccl


def test_cpu_device_has_nothing_to_warm_and_creates_no_group() -> None:
    assert warm_nccl(torch.device("cpu")) is None
    assert not dist.is_initialized()

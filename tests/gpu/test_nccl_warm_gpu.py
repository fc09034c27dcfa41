"""The joiner's NCCL warm-up (executor.switch.nccl_warm) on a GPU (skipped without CUDA, so CI
skips it; runs on the device machine): it creates and shuts down a one-rank communicator without a
default group, and a default NCCL group bound to the device, created afterwards as the joiner's
world is (executor.switch.epoch_world), works."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from executor.job.spawn import free_port
from executor.switch.nccl_warm import warm_nccl

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_warm_up_then_the_world_is_created_and_works() -> None:
    device = torch.device("cuda", 0)
    took = warm_nccl(device)
    assert took is not None and took > 0  # it ran (a failure is logged and returns None)
    assert not dist.is_initialized()  # no default group left behind
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            timeout=timedelta(seconds=60), device_id=device)
    try:
        x = torch.full((4,), 2.0, device=device)
        dist.all_reduce(x)
        assert x.tolist() == [2.0] * 4
    finally:
        dist.destroy_process_group()

"""Fixtures the one-GPU tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module")
def nccl_rank() -> Iterator[None]:
    """A one-rank NCCL process group for the Engine (one per test module)."""
    import torch
    import torch.distributed as dist

    from executor.job.spawn import free_port

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()

"""What accelerators this process can see (the CLI asks through here so planner/ never names torch)."""

from __future__ import annotations

import torch


def cuda_device_count() -> int:
    """Number of visible CUDA devices; 0 on a machine without CUDA."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0

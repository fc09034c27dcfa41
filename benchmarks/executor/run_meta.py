"""Device, versions and date for a multi-process benchmark's JSON."""

from __future__ import annotations

import sys
import time
from typing import Any


def run_versions(gpu: bool) -> dict[str, Any]:
    """Date, torch and Python; on GPUs the device name and count and NCCL's version."""
    import torch

    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "torch": torch.__version__,
                           "python": sys.version.split()[0]}
    if gpu:
        out.update(gpu=torch.cuda.get_device_name(0), device_count=torch.cuda.device_count(),
                   nccl=".".join(map(str, torch.cuda.nccl.version())))
    else:
        out.update(gpu=None, device="cpu (gloo)")
    return out

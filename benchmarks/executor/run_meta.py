"""Device, versions and date for a multi-process benchmark's JSON."""

from __future__ import annotations

import os
import sys
import time
from typing import Any


def run_versions(gpu: bool) -> dict[str, Any]:
    """Date, torch and Python; on GPUs the device name and count, NCCL's version and the ``NCCL_*``
    settings the run's processes inherit (a run under ``NCCL_CUMEM_ENABLE=0`` says so)."""
    import torch

    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "torch": torch.__version__,
                           "python": sys.version.split()[0]}
    if gpu:
        out.update(gpu=torch.cuda.get_device_name(0), device_count=torch.cuda.device_count(),
                   nccl=".".join(map(str, torch.cuda.nccl.version())), nccl_env=nccl_settings())
    else:
        out.update(gpu=None, device="cpu (gloo)")
    return out


def nccl_settings(env: dict[str, str] | None = None) -> dict[str, str]:
    """The ``NCCL_*`` variables of ``env`` (default: this process's), sorted by name."""
    env = os.environ if env is None else env
    return {k: env[k] for k in sorted(env) if k.startswith("NCCL_")}

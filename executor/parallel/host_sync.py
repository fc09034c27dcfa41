"""The one place a training step waits for the device.

On NCCL a rank whose peers are late does not wait in a Python communication call (``work.wait()``
only orders the CUDA stream): its host runs ahead and blocks here, in the step's single device
synchronisation, while the GPU waits inside a collective. The watchdog recognises this frame and
asks the flight recorder (:mod:`executor.job.flight`) whether a collective is unfinished:
then the rank is waiting for peers; otherwise its device is busy (or stuck) computing.
"""

from __future__ import annotations

import torch


def to_host(t: torch.Tensor) -> list[float]:
    """``t.tolist()``: the step's device synchronisation (see the module docstring)."""
    return t.tolist()

"""The CUDA MPS control daemon around a block of work: what lets processes on one GPU run with a share of
its SMs (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, read when each process creates its CUDA context).

Every CUDA process started while the daemon runs joins it, so whatever starts it runs alone on the
machine (tests marked ``gpu_alone``). A daemon that was already running is left running: the block
uses it and only a daemon this block started is quit.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

MPS_CONTROL = "nvidia-cuda-mps-control"
SHARE_VAR = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
QUIT_TIMEOUT_S = 60
Runner = Callable[..., Any]  # subprocess.run's shape: tests pass a fake that records the commands


def mps_available() -> bool:
    return shutil.which(MPS_CONTROL) is not None


@contextmanager
def mps_daemon(run: Runner = subprocess.run) -> Iterator[bool]:
    """Start the daemon for the block (yields whether this block started it) and quit it afterwards."""
    started = run([MPS_CONTROL, "-d"], capture_output=True, text=True, timeout=30).returncode == 0
    try:
        yield started
    finally:
        if started:
            try:
                run([MPS_CONTROL], input="quit\n", capture_output=True, text=True, timeout=QUIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:  # the block's work is done; a daemon slow to stop is no error
                print(f"the MPS daemon did not stop within {QUIT_TIMEOUT_S} s", flush=True)

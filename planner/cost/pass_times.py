"""What a measured row's pass time is: device and host apart (``"device_times": "full-queue"``) or one
figure (every calibration from before).

The profiler (executor/profiler/timing.py) times each repetition on CUDA behind a GPU spin that covers
the host's issue time, so a row's ``forward_s``/``backward_s`` are the GPU's own work and
``forward_host_s``/``backward_host_s`` what the host took to issue it; the measured meta then says
``"device_times": "full-queue"``. A training step, where the host runs ahead across layers, takes
``max(device, host)`` per pass (:meth:`planner.cost.profile.DeviceProfile.ops_time`), so that is the
pass time such a row prices. Older rows (and the packaged profiles) timed a drained queue where the
host was slower: their ``forward_s`` already is the pass time, and they price exactly as before."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DEVICE_TIMES = "device_times"  # key of the measured meta
FULL_QUEUE = "full-queue"  # its value where device times are host-free
HOST_KEY = {"forward_s": "forward_host_s", "backward_s": "backward_host_s"}


def host_free(measured: Mapping[str, Any] | None) -> bool:
    """Whether a ``measured`` section's device times are host-free (timed from a full queue)."""
    meta = (measured or {}).get("meta") or {}
    return isinstance(meta, Mapping) and meta.get(DEVICE_TIMES) == FULL_QUEUE


def split_times(row: Mapping[str, Any], phase: str, full_queue: bool) -> tuple[float, float] | None:
    """``(device_s, host_s)`` of ``phase`` ('forward_s' or 'backward_s') of a host-free row that carries
    its host time; None otherwise (the row's figure is the pass time)."""
    host = row.get(HOST_KEY[phase])
    if not full_queue or isinstance(host, bool) or not isinstance(host, int | float) or not host > 0:
        return None
    return float(row[phase]), float(host)


def pass_seconds(row: Mapping[str, Any], phase: str, full_queue: bool) -> float:
    """The seconds a step pays for ``phase`` of ``row``: ``max(device, host)`` of a host-free row, else
    the row's own figure."""
    both = split_times(row, phase, full_queue)
    return float(row[phase]) if both is None else max(both)

"""Timers that wait for the device: CUDA events on a GPU, the host clock on the CPU.

Every measurement warms up first (module load, cuBLAS handle creation and autotuning stay out of the
numbers), then repeats back to back and keeps the median, which is robust to the odd slow repeat.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


class Marker:
    """A point in the device's stream of work (a CUDA event, or the host clock after a CPU op), and the
    host clock when the host reached it."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._event = torch.cuda.Event(enable_timing=True) if self.cuda else None
        self._t = 0.0

    def record(self) -> None:
        self._t = time.perf_counter()
        if self._event is not None:
            self._event.record()

    def seconds_until(self, other: Marker) -> float:
        """Device seconds from this mark to ``other`` (host seconds on the CPU, where they are the same)."""
        if self._event is not None and other._event is not None:
            return self._event.elapsed_time(other._event) / 1e3
        return other._t - self._t

    def host_seconds_until(self, other: Marker) -> float:
        """Host seconds from this mark's call to ``other``'s: what the host took to issue the work between."""
        return other._t - self._t


@dataclass(frozen=True)
class PhaseTimes:
    """Median seconds per phase: ``device_s`` the device's (as :func:`time_phases` returns), ``host_s``
    the host's to issue the same phase (see :func:`phase_times`)."""

    device_s: tuple[float, ...]
    host_s: tuple[float, ...]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def phase_times(step: Callable[[Callable[[int], None]], None], phases: int, device: torch.device,
                warmup: int, repeats: int) -> PhaseTimes:
    """Median device and host seconds of each of ``phases`` consecutive phases of ``step``.

    ``step(mark)`` runs one repetition and calls ``mark(i)`` at the start of phase ``i`` and
    ``mark(phases)`` at its end, so one repetition yields every phase (e.g. forward then backward).

    The repetitions run back to back, as a training step's micro-batches do: the host queues the next
    one while the device still runs the last, and the device is waited for once, after the last. Timed
    from an idle device (a synchronize before every repetition), the first phase held whatever the host
    took to issue it: its launches and any stall on the way, which a step hides behind the work queued
    before it. On 4x H100 (2026-11-27) the layer forward of calibrate's first rows took 1.76 ms at
    micro-batch 2 where the same point timed later took 1.34 and the step traced 1.26; the backward,
    timed behind the forward's queued kernels, agreed with the step within 7 %. Where the host is
    slower than the device the queue drains and its time is measured, as a launch-bound step pays it.

    Host time (``host_s``) is the host clock between the same two ``mark`` calls: the seconds the host
    took to issue the phase (Python, autograd, kernel launches), with no device wait added. Where it
    is well under the device time the phase is device-bound: the device ran the work as fast as it
    could. Where it reaches the device time (host >= device) the phase is launch-bound: the device
    waited on the host, and the device time measures the host's issue rate, not the GPU (on 4x H100,
    2026-11-27, the whole GPU's llama-1.3b layer took longer at micro-batch 1 and 2 than at 4). Host
    time also holds any wait the phase makes on the device (a synchronizing op, or a launch queue
    full of about a thousand kernels), so host ~= device alone does not prove launch-bound; host
    well under device does prove device-bound. On the CPU the two are the same clock."""
    for _ in range(warmup):
        step(lambda i: None)
    taken: list[list[Marker]] = []
    for _ in range(repeats):
        marks = [Marker(device) for _ in range(phases + 1)]

        def mark(i: int, marks: Sequence[Marker] = marks) -> None:
            marks[i].record()

        step(mark)
        taken.append(marks)
    synchronize(device)
    return PhaseTimes(
        device_s=tuple(statistics.median(m[i].seconds_until(m[i + 1]) for m in taken) for i in range(phases)),
        host_s=tuple(statistics.median(m[i].host_seconds_until(m[i + 1]) for m in taken) for i in range(phases)))


def time_phases(step: Callable[[Callable[[int], None]], None], phases: int, device: torch.device,
                warmup: int, repeats: int) -> list[float]:
    """Median device seconds of each phase of ``step`` (:func:`phase_times`, whose docstring says how
    they are timed, without the host's)."""
    return list(phase_times(step, phases, device, warmup, repeats).device_s)


def time_call(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int) -> float:
    """Median seconds of ``fn()``."""

    def step(mark: Callable[[int], None]) -> None:
        mark(0)
        fn()
        mark(1)

    return time_phases(step, 1, device, warmup, repeats)[0]

"""Timers that wait for the device: CUDA events on a GPU, the host clock on the CPU.

Every measurement warms up first (module load, cuBLAS handle creation and autotuning stay out of the
numbers), then repeats and keeps the median, which is robust to the odd slow repeat. On CUDA each
repetition is timed from a full launch queue (:func:`phase_times`), so its device time is the GPU's
alone and its host time what the host took to issue it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

SPIN_FACTOR = 1.5  # the spin before a repetition lasts this many times the host's issue time of the last one ...
SPIN_MARGIN_S = 2e-4  # ... plus this (a host stall of a fraction of a millisecond stays hidden too)
SPIN_MAX_S = 1.0  # and never longer (a warm-up that recompiled took the host seconds; the next repetition adapts)
RATE_PROBE_CYCLES = 2_000_000  # ~1 ms at 2 GHz: long enough that the events' resolution does not matter
_cycles_per_s: dict[int, float] = {}  # per CUDA device index, measured once per process
# Where a row's host times come from on CUDA: "spun", the same repetitions as the device times (the host
# issues while the GPU spins), or "idle", as many repetitions after them on an idle GPU, as a
# launch-bound step issues (its GPU mostly waits). Behind the spin a llama-1.3b layer's passes took the
# host ~1.8 ms on 4x H100 (2026-11-27 22:00), against ~1.2 ms timed on an idle GPU the day before: which
# one a step pays is to be measured (issue 32) before the default changes.
HOST_TIMES = "spun"


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


def spin_cycles(host_s: float, cycles_per_s: float, factor: float = SPIN_FACTOR, margin_s: float = SPIN_MARGIN_S
                ) -> int:
    """GPU clock cycles of the spin (``torch.cuda._sleep``) that keeps the device busy while the host
    issues a repetition it took ``host_s`` seconds to issue last time: ``factor · host_s + margin_s``
    seconds at ``cycles_per_s`` (:func:`cycles_per_second`), at most :data:`SPIN_MAX_S`."""
    if host_s < 0 or cycles_per_s <= 0:
        raise ValueError(f"host_s must be >= 0 and cycles_per_s > 0, got {host_s} and {cycles_per_s}")
    return max(1, round(min(factor * host_s + margin_s, SPIN_MAX_S) * cycles_per_s))


def cycles_per_second(device: torch.device) -> float:
    """The rate at which ``torch.cuda._sleep`` spends cycles on ``device``, timed once per process with
    CUDA events (the fastest of a few tries: a try can only be slowed, by the host or a clock ramp)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    rate = _cycles_per_s.get(index)
    if rate is None:
        with torch.cuda.device(index):
            torch.cuda._sleep(RATE_PROBE_CYCLES)  # the clocks ramp up and the kernel loads
            tries = []
            for _ in range(3):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                torch.cuda._sleep(RATE_PROBE_CYCLES)
                end.record()
                end.synchronize()
                tries.append(start.elapsed_time(end) / 1e3)
        rate = _cycles_per_s[index] = RATE_PROBE_CYCLES / min(tries)
    return rate


def phase_times(step: Callable[[Callable[[int], None]], None], phases: int, device: torch.device,
                warmup: int, repeats: int) -> PhaseTimes:
    """Median device and host seconds of each of ``phases`` consecutive phases of ``step``.

    ``step(mark)`` runs one repetition and calls ``mark(i)`` at the start of phase ``i`` and
    ``mark(phases)`` at its end, so one repetition yields every phase (e.g. forward then backward).

    Device time (``device_s``) on CUDA is the GPU's alone, from a full launch queue: each repetition
    starts on an idle device (a synchronize), the host first queues a GPU spin (``torch.cuda._sleep``)
    lasting :data:`SPIN_FACTOR` times what the host took to issue the previous repetition (the last
    warm-up's for the first) plus :data:`SPIN_MARGIN_S`, then issues the repetition; by the time the
    spin ends every kernel of it is queued, so the device runs them back to back and the CUDA events
    between marks time the device's own work. Why: a llama-1.3b layer on H100 is launch-bound at small
    shapes (the host takes ~1 ms to issue a forward the GPU runs in less), and timed without the spin
    the events measured the host's issue rate (4x H100, 2026-11-27: device ~= host time in almost every
    row, the whole GPU slower at micro-batch 1 than at 4), which the calibration then fitted GPU terms
    to. (Before the spin, repetitions ran back to back so each was timed behind the last one's queued
    work; a drained queue still timed the host.) One repetition per spin and a synchronize before the
    next keep the launch queue (about a thousand entries) from filling, which would block the host and
    put device time into the host's figure. A repetition whose host stalls longer than the spin lets
    the queue drain and is timed high; the median keeps such outliers out.

    Host time (``host_s``) is the host clock between the same two ``mark`` calls: the seconds the host
    took to issue the phase (Python, autograd, kernel launches), with no device wait added unless the
    phase itself synchronizes. A training step, where the host runs ahead across many layers, takes
    ``max(device, host)`` per pass (:mod:`planner.cost.profile`); the rows keep the two apart
    (``"device_times": "full-queue"`` in the measured meta, :mod:`planner.cost.pass_times`).

    Steps with collectives (live TP rows, :func:`executor.profiler.compute.measure_layer` with a
    ``group``) must start with a collective before ``mark(0)``, as ``measure_layer`` does: every rank
    spins its own length, and the leading all-reduce, queued behind the spin, starts every rank's
    timed region together after the slowest rank's spin (a later rank's peer waits inside that
    all-reduce, outside the interval). Each rank's spin covers its own issue time, so no rank's
    interval holds its host; the spin is a local kernel, so the ranks' order of collectives and the
    deadlock argument are unchanged.

    On the CPU the two are the same clock and the repetitions run back to back, waited for once."""
    if device.type == "cuda":
        return _full_queue_times(step, phases, device, warmup, repeats)
    for _ in range(warmup):
        step(lambda i: None)
    taken = [_run(step, phases, device) for _ in range(repeats)]
    synchronize(device)
    return _medians(taken, phases)


def _run(step: Callable[[Callable[[int], None]], None], phases: int, device: torch.device) -> list[Marker]:
    marks = [Marker(device) for _ in range(phases + 1)]

    def mark(i: int, marks: Sequence[Marker] = marks) -> None:
        marks[i].record()

    step(mark)
    return marks


def _full_queue_times(step: Callable[[Callable[[int], None]], None], phases: int, device: torch.device,
                      warmup: int, repeats: int) -> PhaseTimes:
    """:func:`phase_times` on CUDA: each repetition behind a spin that covers its issue time; with
    :data:`HOST_TIMES` ``"idle"`` the host times come from as many repetitions on an idle GPU after."""
    rate = cycles_per_second(device)
    host = 0.0  # what the host took to issue the last repetition
    for _ in range(max(warmup, 1)):  # at least one: the first spin's length comes from it
        synchronize(device)
        t0 = time.perf_counter()
        step(lambda i: None)
        host = time.perf_counter() - t0
    taken = []
    for _ in range(repeats):
        synchronize(device)
        torch.cuda._sleep(spin_cycles(host, rate))
        t0 = time.perf_counter()
        taken.append(_run(step, phases, device))
        host = time.perf_counter() - t0
    synchronize(device)
    spun = _medians(taken, phases)
    if HOST_TIMES == "spun":
        return spun
    idle = []
    for _ in range(repeats):
        synchronize(device)
        idle.append(_run(step, phases, device))
    synchronize(device)
    return PhaseTimes(device_s=spun.device_s, host_s=_medians(idle, phases).host_s)


def _medians(taken: list[list[Marker]], phases: int) -> PhaseTimes:
    return PhaseTimes(
        device_s=tuple(statistics.median(m[i].seconds_until(m[i + 1]) for m in taken) for i in range(phases)),
        host_s=tuple(statistics.median(m[i].host_seconds_until(m[i + 1]) for m in taken) for i in range(phases)))


def time_phases(step: Callable[[Callable[[int], None]], None], phases: int, device: torch.device,
                warmup: int, repeats: int) -> list[float]:
    """Median device seconds of each phase of ``step`` (:func:`phase_times`, whose docstring says how
    they are timed, without the host's)."""
    return list(phase_times(step, phases, device, warmup, repeats).device_s)


def time_call(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int) -> float:
    """Median seconds of ``fn()`` (on CUDA the device's, from a full queue: :func:`phase_times`)."""

    def step(mark: Callable[[int], None]) -> None:
        mark(0)
        fn()
        mark(1)

    return time_phases(step, 1, device, warmup, repeats)[0]

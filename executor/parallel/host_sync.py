"""The one place a training step waits for the device.

A step's few values the host must see (the loss and the gradient norm) travel in a
:class:`HostRead`: :meth:`HostRead.start` queues a non-blocking copy into a pinned buffer and an
event right behind it, the caller queues the rest of the step (clipping, the optimizer), and
:meth:`HostRead.wait` blocks until that event only. The device never waits for the host in the
middle of a step: while the host reads, the optimizer's kernels are already queued behind the copy.

On NCCL a rank whose peers are late does not wait in a Python communication call (``work.wait()``
only orders the CUDA stream): its host runs ahead and blocks here, in :meth:`HostRead.wait`,
while the GPU waits inside a collective. The watchdog recognises this file's frames and asks the
flight recorder (:mod:`executor.job.flight`) whether a collective is unfinished: then the rank is
waiting for peers; otherwise its device is busy (or stuck) computing.
"""

from __future__ import annotations

import torch


class HostRead:
    """A small device tensor's values on their way to the host; one buffer reused step after step
    (each read is waited for before the next starts)."""

    def __init__(self) -> None:
        self._buf: torch.Tensor | None = None
        self._src: torch.Tensor | None = None
        self._event: torch.Event | None = None

    def start(self, t: torch.Tensor) -> None:
        """Queue the copy of ``t`` (on CPU there is nothing to queue: :meth:`wait` reads it)."""
        self._src, self._event = t, None
        if t.device.type == "cpu":
            return
        if self._buf is None or self._buf.shape != t.shape or self._buf.dtype != t.dtype:
            self._buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        self._buf.copy_(t, non_blocking=True)
        self._event = torch.Event(device=t.device)
        self._event.record()

    def wait(self) -> list[float]:
        """The values of the tensor given to :meth:`start`, once the device has copied them."""
        if self._src is None:
            raise RuntimeError("HostRead.wait() without a start()")
        src, event, self._src, self._event = self._src, self._event, None, None
        if event is None:
            return src.tolist()
        event.synchronize()
        assert self._buf is not None
        return self._buf.tolist()

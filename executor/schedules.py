"""Pipeline schedules (GPipe and 1F1B) for one stage of one pipeline.

Every pipeline runs its own schedule with its own micro-batch count ``M`` and micro-batch sizes
(``Pipeline.micro_batch_sizes()``, possibly uneven); pipelines never wait for each other until the
gradient sync. Micro-batch ``j`` carries ``[mb_j, s]`` tokens, so every boundary tensor has the
known shape ``[mb_j, s, h]``. A packed micro-batch (documents back to back in one row, ``docs``
set) is ``[1, T_j]``; every rank of the pipeline holds the same packing, so shapes stay known.

* **GPipe**: all ``M`` forwards, then all ``M`` backwards (in reverse order).
* **1F1B** (non-interleaved, as in PipeDream-Flush/Megatron): stage ``i`` of ``S`` runs
  ``w = min(S-i-1, M)`` warm-up forwards, then ``M-w`` steady rounds of one forward + one backward,
  then ``w`` cool-down backwards. At most ``S-i`` micro-batches are in flight on stage ``i``.
  Steady rounds use the combined send/receive of :mod:`executor.p2p`, which is what makes the
  schedule deadlock-free even when sends block.

The last stage's loss for micro-batch ``j`` is ``Σ_tokens CE · loss_scale`` with
``loss_scale = 1 / global_tokens``; backward of that scalar makes the accumulated gradients those of
the global mean loss (pipelines' gradients are later SUM-reduced).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from executor.model import StageModule
from executor.p2p import StageComm
from executor.packed_docs import DocSpans
from executor.trace import NO_TRACE, NullTrace, StepTrace


@dataclass
class MicroBatch:
    inputs: torch.Tensor  # [mb, s] token ids
    labels: torch.Tensor  # [mb, s]
    docs: DocSpans | None = None  # packed documents of the one row (mb == 1), see executor.packed_docs


class _Runner:
    """Forward/backward of single micro-batches on one stage, holding what backward needs."""

    def __init__(self, module: StageModule, micro: list[MicroBatch], loss_scale: float,
                 autocast: Callable[[], contextlib.AbstractContextManager], trace: NullTrace | StepTrace = NO_TRACE):
        self.module = module
        self.trace = trace
        self.micro = micro
        self.loss_scale = loss_scale
        self.autocast = autocast
        self.saved: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = {}
        self.loss: torch.Tensor | None = None
        h = module.spec.hidden_size
        self.shapes = [(mb.inputs.shape[0], mb.inputs.shape[1], h) for mb in micro]

    def forward(self, j: int, x: torch.Tensor | None) -> torch.Tensor | None:
        mb = self.micro[j]
        if self.module.first:
            inp: torch.Tensor | None = None
            src = mb.inputs
        else:
            assert x is not None
            inp = x.requires_grad_(True)
            src = inp
        with self.trace.span("forward", j), self.autocast():
            out = self.module(src, mb.docs) if mb.docs is not None else self.module(src)
            if self.module.last:
                out = self.module.loss(out, mb.labels).sum() * self.loss_scale
        if self.module.last:
            d = out.detach()
            self.loss = d if self.loss is None else self.loss + d
            self.saved[j] = (inp, out)
            return None
        self.saved[j] = (inp, out)
        return out

    def backward(self, j: int, dy: torch.Tensor | None) -> torch.Tensor | None:
        inp, out = self.saved.pop(j)
        with self.trace.span("backward", j):
            if self.module.last:
                out.backward()
            else:
                assert dy is not None
                torch.autograd.backward(out, grad_tensors=dy.to(out.dtype))
        return None if inp is None else inp.grad


def run_gpipe(runner: _Runner, comm: StageComm) -> None:
    m = len(runner.micro)
    for j in range(m):
        y = runner.forward(j, comm.recv_forward(runner.shapes[j]))
        if y is not None:
            comm.send_forward(y)
    for j in reversed(range(m)):
        comm.send_backward(runner.backward(j, comm.recv_backward(runner.shapes[j])))


def run_1f1b(runner: _Runner, comm: StageComm, n_stages: int) -> None:
    m = len(runner.micro)
    st = comm.stage
    warm = min(n_stages - st.index - 1, m)
    fwd = bwd = 0
    for _ in range(warm):
        y = runner.forward(fwd, comm.recv_forward(runner.shapes[fwd]))
        if y is not None:
            comm.send_forward(y)
        fwd += 1
    steady = m - warm
    x = comm.recv_forward(runner.shapes[fwd]) if steady > 0 else None
    for i in range(steady):
        y = runner.forward(fwd, x)
        fwd += 1
        dy = comm.send_forward_recv_backward(y, runner.shapes[bwd]) if y is not None else \
            comm.recv_backward(runner.shapes[bwd])
        dx = runner.backward(bwd, dy)
        bwd += 1
        if i == steady - 1:
            comm.send_backward(dx)
            x = None
        else:
            x = comm.send_backward_recv_forward(dx, runner.shapes[fwd])
    for _ in range(warm):
        comm.send_backward(runner.backward(bwd, comm.recv_backward(runner.shapes[bwd])))
        bwd += 1


def run_schedule(kind: str, *, module: StageModule, comm: StageComm, micro: list[MicroBatch], loss_scale: float,
                 n_stages: int, autocast: Callable[[], contextlib.AbstractContextManager] | None = None,
                 trace: NullTrace | StepTrace = NO_TRACE) -> torch.Tensor | None:
    """Run forward and backward of all micro-batches; gradients accumulate in ``module``'s ``.grad``.

    Returns the summed scaled loss (a detached scalar tensor) on the last stage, None elsewhere.
    ``trace`` records each micro-batch's forward and backward (:mod:`executor.trace`).
    """
    runner = _Runner(module, micro, loss_scale, autocast or contextlib.nullcontext, trace)
    if kind == "gpipe":
        run_gpipe(runner, comm)
    elif kind == "1f1b":
        run_1f1b(runner, comm, n_stages)
    else:
        raise ValueError(f"unknown schedule {kind!r} (use 1f1b or gpipe)")
    return runner.loss

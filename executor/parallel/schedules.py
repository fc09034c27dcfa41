"""The interpreter of pipeline schedules: runs one stage's ops from :mod:`planner.schedules`.

The schedule registry (planner, no torch) says, per stage, which forward (``F``) and backward
(``B``) of which micro-batch comes next; the cost model's simulator prices the same ops. Here each
op receives its input, computes and sends its output. A schedule the registry marks untrained
(``trained=False``) is refused in one line before anything runs. An interleaved stage
(``interleaved-1f1b``) holds several layer chunks in one module; its ops name the chunk, and its
messages go to the stage holding the neighbouring virtual stage (the last stage sends to the first
between chunks), posted in rounds (:func:`run_rounds`, :mod:`planner.schedules.comm`; with CP stages
piece-wise between slot leaders, :mod:`executor.parallel.cp_p2p`). Where the
ops hold ``W`` ops (ZB-H1), a ``B`` computes only the input gradient and queues the linear
layers' weight-gradient GEMMs, which its ``W`` runs (:mod:`executor.parallel.weight_grad_store`);
a ``W`` communicates nothing. On the pipeline's first stage, whose ``B`` sends nothing, a ``B``
directly followed by its own ``W`` (every one of ZB-H1, :func:`planner.schedules.inline_w.inline_w`)
runs the plain backward instead, its micro-batch's forward the plain linears, and the ``W`` does
nothing: deferring there would only hold the queued operands of a whole micro-batch until the very
next op.

Every pipeline runs its own schedule with its own micro-batch count ``M`` and micro-batch sizes
(``Pipeline.micro_batch_sizes()``, possibly uneven); pipelines never wait for each other until the
gradient sync. Micro-batch ``j`` carries ``[mb_j, s]`` tokens, so every boundary tensor has the
known shape ``[mb_j, s, h]``. A packed micro-batch (documents back to back in one row, ``docs``
set) is ``[1, T_j]``; every rank of the pipeline holds the same packing, so shapes stay known.

Communication order, one chunk per stage (why no two ranks wait on each other; the same rule is
:func:`planner.schedules.comm.exchanges`, whose :func:`~planner.schedules.comm.check_pairing`
the tests play over every registered schedule): an ``F`` receives from the previous
stage and sends to the next; a ``B`` receives from the next and sends to the previous. When the
next op receives from the very peer this op sends to (``F`` then ``B``: the next stage; ``B`` then
``F``: the previous stage) the send and that receive are posted together
(``send_forward_recv_backward`` / ``send_backward_recv_forward`` of :mod:`executor.parallel.p2p`), so two
neighbours in 1F1B's steady state, each sending to the other, never both block in a send.
Otherwise a send is posted alone, then the next op's receive (a ``W`` between a ``B`` and an ``F``
runs after the ``B``'s send and before the ``F``'s receive: it fills the wait, never delays a
peer). For 1F1B this is Megatron's order; GPipe's one ``F``-to-``B`` turn is fused too, which
only merges a send with a receive that follows it.

The last stage's loss for micro-batch ``j`` is ``Σ_tokens CE · loss_scale`` with
``loss_scale = 1 / global_tokens``; backward of that scalar makes the accumulated gradients those of
the global mean loss (pipelines' gradients are later SUM-reduced).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from executor.data.packed_docs import DocSpans
from executor.model.llama import StageModule
from executor.parallel.cp_p2p import CPStageComm
from executor.parallel.p2p import StageComm
from executor.parallel.weight_grad_store import WeightGradStore, install
from executor.train.trace import NO_TRACE, NullTrace, StepTrace
from planner.plan import Plan
from planner.schedules import StageOp, schedule_named
from planner.schedules.comm import op_peers, rounds
from planner.schedules.inline_w import inline_w


@dataclass
class MicroBatch:
    inputs: torch.Tensor  # [mb, s] token ids
    labels: torch.Tensor  # [mb, s]
    docs: DocSpans | None = None  # packed documents of the one row (mb == 1), see executor.data.packed_docs


def runner_chunks(module: StageModule) -> int:
    """Layer chunks of a stage module (1 unless interleaved)."""
    return len(getattr(module, "chunk_keys", ())) or 1


class _Runner:
    """Forward/backward of single micro-batches on one stage, holding what backward needs."""

    def __init__(self, module: StageModule, micro: list[MicroBatch], loss_scale: float,
                 autocast: Callable[[], contextlib.AbstractContextManager], trace: NullTrace | StepTrace = NO_TRACE,
                 wgrad: WeightGradStore | None = None, inline: frozenset[tuple[int, int]] = frozenset()):
        self.module = module
        self.wgrad = wgrad  # set: backward defers the weight gradients to weight_grads (W ops)
        self.inline = inline  # (micro-batch, chunk) whose W is fused into the B (planner.schedules.inline_w)
        self.trace = trace
        self.micro = micro
        self.loss_scale = loss_scale
        self.autocast = autocast
        self.saved: dict[tuple[int, int], tuple[torch.Tensor | None, torch.Tensor]] = {}  # (micro-batch, chunk)
        self.chunks = runner_chunks(module)  # layer chunks of an interleaved stage
        self.loss: torch.Tensor | None = None
        h = module.spec.hidden_size
        self.shapes = [(mb.inputs.shape[0], mb.inputs.shape[1], h) for mb in micro]

    def forward(self, j: int, x: torch.Tensor | None, chunk: int = 0) -> torch.Tensor | None:
        mb = self.micro[j]
        first, last = self._ends(chunk)
        if first:
            inp: torch.Tensor | None = None
            src = mb.inputs
        else:
            assert x is not None
            inp = x.requires_grad_(True)
            src = inp
        kw = {"chunk": chunk} if self.chunks > 1 else {}
        # nothing in flight: this micro-batch's backward is the next, so the linears may add the
        # gradients accumulated so far inside their weight-gradient GEMMs (executor.model.cast_once)
        self.module.accumulate_in_gemm = self.wgrad is None and self.chunks == 1 and not self.saved
        try:
            with self.trace.span("forward", j), self._path(j, chunk), self.autocast():
                out = self.module(src, mb.docs, **kw) if mb.docs is not None else self.module(src, **kw)
                if last:
                    out = self.module.loss(out, mb.labels).sum() * self.loss_scale
        finally:
            self.module.accumulate_in_gemm = False
        self.saved[j, chunk] = (inp, out)
        if last:
            d = out.detach()
            self.loss = d if self.loss is None else self.loss + d
            return None
        return out

    def _ends(self, chunk: int) -> tuple[bool, bool]:
        """Whether ``chunk`` is the pipeline's first virtual stage (takes token ids) and its last (the loss)."""
        return self.module.first and chunk == 0, self.module.last and chunk == self.chunks - 1

    def _path(self, j: int, chunk: int) -> contextlib.AbstractContextManager:
        """The linears' plain path for a micro-batch whose ``W`` is inlined (its forward, and its
        backward, which may recompute the forward), else nothing."""
        if self.wgrad is not None and (j, chunk) in self.inline:
            return self.wgrad.inline()
        return contextlib.nullcontext()

    def backward(self, j: int, dy: torch.Tensor | None, chunk: int = 0) -> torch.Tensor | None:
        inp, out = self.saved.pop((j, chunk))
        if self.wgrad is None or (j, chunk) in self.inline:
            defer = self._path(j, chunk)  # the plain backward: weight gradients inline
        else:
            defer = self.wgrad.deferring(j)
        with self.trace.span("backward", j), defer:
            if self._ends(chunk)[1]:
                out.backward()
            else:
                assert dy is not None
                torch.autograd.backward(out, grad_tensors=dy.to(out.dtype))
        return None if inp is None else inp.grad

    def weight_grads(self, j: int, chunk: int = 0) -> None:
        """The ``W`` op of micro-batch ``j``: the weight gradients its ``B`` deferred; nothing where
        the ``B`` computed them inline (its span stays, empty, so the trace pairs with the ops; the
        ``B``'s span holds the fused time, which benchmarks/executor/bubbles.py counts as ``B+W``)."""
        if self.wgrad is None:
            raise ValueError("a W op needs a runner whose backward defers weight gradients")
        with self.trace.span("backward", j):  # the trace's kinds (planner.timeline) count W as backward
            if (j, chunk) not in self.inline:
                self.wgrad.run(j)


def check_trainable(schedule: str, stages: int, micro_batches: int, field: str = "schedule") -> None:
    """Refuse, as one :class:`~planner.errors.SpecError` on ``field``, a schedule the registry marks
    untrained (an unknown name is the registry's SpecError)."""
    schedule_named(schedule, field).check_trained(field)


def check_plan_schedules(plan: Plan) -> None:
    """:func:`check_trainable` for every pipeline of ``plan``."""
    for pi, pipe in enumerate(plan.pipelines):
        check_trainable(pipe.schedule, len(pipe.stages), pipe.micro_batches, f"pipelines[{pi}].schedule")


def run_ops(runner: _Runner, comm: StageComm | CPStageComm, ops: Sequence[StageOp]) -> None:
    """Run ``ops`` (forwards and backwards of this stage) in order, fusing a send with the next
    op's receive from the same peer (module docstring)."""
    pending: torch.Tensor | None = None
    fused = False  # ``pending`` holds the current op's input, received with the last send
    for k, op in enumerate(ops):
        j = op.micro_batch
        nxt = ops[k + 1] if k + 1 < len(ops) else None
        turn = nxt is not None and {op.kind, nxt.kind} == {"F", "B"}
        if op.kind == "F":
            y = runner.forward(j, pending if fused else comm.recv_forward(runner.shapes[j]))
            if turn and nxt is not None:
                shape = runner.shapes[nxt.micro_batch]
                pending = comm.send_forward_recv_backward(y, shape) if y is not None else comm.recv_backward(shape)
            elif y is not None:
                comm.send_forward(y)
        elif op.kind == "B":
            dx = runner.backward(j, pending if fused else comm.recv_backward(runner.shapes[j]))
            if turn and nxt is not None:
                pending = comm.send_backward_recv_forward(dx, runner.shapes[nxt.micro_batch])
            else:
                comm.send_backward(dx)
        else:  # W: no communication (``turn`` is False around it, so nothing is pending)
            runner.weight_grads(j, op.chunk)
        fused = turn


def run_rounds(runner: _Runner, comm: StageComm | CPStageComm, ops: Sequence[StageOp], stages: int) -> None:
    """Run an interleaved stage's ``ops`` in rounds (:func:`planner.schedules.comm.rounds`): before
    each round one exchange posts the sends of the last round's outputs and the receives of this
    round's inputs (sends first, then receives, each in op order: the order
    :func:`planner.schedules.comm.exchanges` proves free of waits in a ring); one more exchange
    sends the last round's outputs."""
    stage, chunks = comm.stage.index, runner.chunks
    peers = [op_peers(op, stages, stage, chunks) for op in ops]
    sends: list[tuple[torch.Tensor | None, int]] = []
    for r in rounds(ops, chunks):
        takes = [(k, src) for k in r if (src := peers[k].recv) is not None]
        got = comm.exchange(sends, [(runner.shapes[ops[k].micro_batch], src) for k, src in takes]) \
            if sends or takes else []
        inputs = dict(zip([k for k, _ in takes], got))
        sends = []
        for k in r:
            op = ops[k]
            step = runner.forward if op.kind == "F" else runner.backward
            out = step(op.micro_batch, inputs.get(k), op.chunk)
            if (to := peers[k].send) is not None:
                sends.append((out, to))
    if sends:
        comm.exchange(sends, [])


def run_schedule(kind: str, *, module: StageModule, comm: StageComm | CPStageComm, micro: list[MicroBatch],
                 loss_scale: float, n_stages: int,
                 autocast: Callable[[], contextlib.AbstractContextManager] | None = None,
                 trace: NullTrace | StepTrace = NO_TRACE) -> torch.Tensor | None:
    """Run forward and backward of all micro-batches under the registry's schedule ``kind``;
    gradients accumulate in ``module``'s ``.grad``.

    Returns the summed scaled loss (a detached scalar tensor) on the last stage, None elsewhere.
    ``trace`` records each micro-batch's forward and backward (:mod:`executor.train.trace`).
    """
    check_trainable(kind, n_stages, len(micro))
    sched = schedule_named(kind)
    # a hot-switching phase may give a pipeline no sequences: its ranks have no op (and no message)
    ops = sched.ops(n_stages, comm.stage.index, len(micro), runner_chunks(module)) if micro else []
    wgrad = WeightGradStore() if any(op.kind == "W" for op in ops) else None
    runner = _Runner(module, micro, loss_scale, autocast or contextlib.nullcontext, trace, wgrad,
                     inline_w(ops, comm.stage.index == 0))
    install(module, wgrad)
    try:
        if sched.chunks > 1:
            run_rounds(runner, comm, ops, n_stages)
        else:
            run_ops(runner, comm, ops)
    finally:
        install(module, None)
    if wgrad is not None and wgrad.pending():
        raise RuntimeError(f"the {kind} ops left weight gradients of micro-batches {wgrad.pending()} unrun")
    return runner.loss

"""Stage-boundary communication between pipeline stages of any TP degrees, both directions.

Activations (and their gradients) at a stage boundary are replicated over each stage's TP ranks.
So only the stage *leaders* talk across the boundary, and the receiving leader broadcasts the
tensor inside its TP group::

    stage s (tp 4)          stage s+1 (tp 2)
    L ─────── activation ──────▶ L ── broadcast ──▶ r
    L ◀── broadcast ── L ◀──── input grad ────── L          (TP 4 ← TP 2, gradient direction)

This is correct for any pair of TP degrees (4 → 2 → 1 → 4 ...). The combined operations
(``send_forward_recv_backward`` and its mirror) post their send and receive together
(``batch_isend_irecv``), which is what keeps a 1F1B schedule free of deadlocks when sends block
until they are received. Receive shapes are known from the plan (micro-batch sizes are
deterministic), so no shapes are exchanged. An interleaved stage posts each round's messages with
:meth:`StageComm.exchange` (peers by stage index, the last and first stages talking between
chunks; :mod:`planner.schedules.comm` gives the order and why it never waits in a ring).

Where a side of a boundary splits the sequence (``cp > 1``), :mod:`executor.parallel.cp_p2p` does the
same exchange piece-wise between CP slot leaders; this class stays the path of every other boundary.

On NCCL (:mod:`executor.parallel.groups` gives the whole rule): every boundary has its own two-rank group,
created and connected before the first step, so a leader's first send never waits for the set-up
of a communicator that ranks outside the boundary would have to join; ``req.wait()`` only orders
the compute stream after the transfer (the host runs on), and the broadcast that follows is
issued after it on every rank of the receiving stage, so each rank's device runs its p2p and TP
operations in program order — the order the schedules prove deadlock-free.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from executor.train.trace import NO_TRACE, NullTrace, StepTrace
from planner.layout import StageTopo


class StageComm:
    """p2p of one rank of ``stage``; ``tp_group`` is the stage's TP group (None when tp == 1)."""

    def __init__(self, stage: StageTopo, rank: int, tp_group: Any, *, device: torch.device,
                 dtype: torch.dtype = torch.float32, prev_group: Any = None, next_group: Any = None,
                 leaders: tuple[int, ...] = (), wrap_group: Any = None):
        self.stage = stage
        self.rank = rank
        self.tp_group = tp_group
        # the boundary groups (leaders only; None on gloo test set-ups that use the default group)
        self.peer_groups = {stage.prev_leader: prev_group, stage.next_leader: next_group}
        # an interleaved pipeline: every stage's leader (exchange() names peers by stage index), and
        # the first and last stages' group between chunks (of two stages, the one boundary's)
        self.leaders = leaders
        if leaders and stage.index in (0, len(leaders) - 1):
            self.peer_groups.setdefault(leaders[-1] if stage.index == 0 else leaders[0], wrap_group)
        self.device = device
        self.dtype = dtype
        self.is_leader = rank == stage.leader
        self.trace: NullTrace | StepTrace = NO_TRACE  # executor.train.trace: p2p spans when tracing

    # -------------------------------------------------------------------------- primitives
    def _exchange(self, send: torch.Tensor | None, send_to: int | None, recv_shape: tuple[int, ...] | None,
                  recv_from: int | None) -> torch.Tensor | None:
        """Leader: post the send and/or receive together and wait; then broadcast the received
        tensor inside the TP group."""
        sends = send is not None and send_to is not None
        if not sends and (recv_shape is None or recv_from is None):
            return None
        with self.trace.span("p2p"):
            return self._exchange_now(send if sends else None, send_to, recv_shape, recv_from)

    def _exchange_now(self, send: torch.Tensor | None, send_to: int | None, recv_shape: tuple[int, ...] | None,
                      recv_from: int | None) -> torch.Tensor | None:
        buf = None
        if recv_shape is not None and recv_from is not None:
            buf = torch.empty(recv_shape, dtype=self.dtype, device=self.device)
        if self.is_leader:
            ops = []
            if send is not None and send_to is not None:
                ops.append(dist.P2POp(dist.isend, send.detach().to(self.dtype).contiguous(), send_to,
                                      group=self.peer_groups.get(send_to)))
            if buf is not None:
                ops.append(dist.P2POp(dist.irecv, buf, recv_from, group=self.peer_groups.get(recv_from)))
            if ops:
                for req in dist.batch_isend_irecv(ops):
                    req.wait()
        if buf is not None and self.tp_group is not None:
            dist.broadcast(buf, src=self.stage.leader, group=self.tp_group)
        return buf

    # -------------------------------------------------------------------------- schedule API
    def recv_forward(self, shape: tuple[int, ...]) -> torch.Tensor | None:
        """Input activation of this stage (None on the first stage)."""
        return self._exchange(None, None, shape, self.stage.prev_leader)

    def send_forward(self, y: torch.Tensor) -> None:
        self._exchange(y, self.stage.next_leader, None, None)

    def recv_backward(self, shape: tuple[int, ...]) -> torch.Tensor | None:
        """Gradient of this stage's output (None on the last stage)."""
        return self._exchange(None, None, shape, self.stage.next_leader)

    def send_backward(self, dx: torch.Tensor | None) -> None:
        self._exchange(dx, self.stage.prev_leader, None, None)

    def send_forward_recv_backward(self, y: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor | None:
        return self._exchange(y, self.stage.next_leader, shape, self.stage.next_leader)

    def send_backward_recv_forward(self, dx: torch.Tensor | None, shape: tuple[int, ...]) -> torch.Tensor | None:
        return self._exchange(dx, self.stage.prev_leader, shape, self.stage.prev_leader)

    def exchange(self, sends: list[tuple[torch.Tensor | None, int]],
                 recvs: list[tuple[tuple[int, ...], int]]) -> list[torch.Tensor]:
        """Interleaved pipelines: post ``sends`` (tensor, peer stage) and ``recvs`` (shape, peer
        stage) together — one ``batch_isend_irecv`` per boundary group, sends first, each in the
        given order — and wait; then broadcast each received tensor inside the TP group, in order."""
        if not sends and not recvs:
            return []
        bufs = [torch.empty(shape, dtype=self.dtype, device=self.device) for shape, _ in recvs]
        with self.trace.span("p2p"):
            if self.is_leader:
                by_group: dict[int, list[Any]] = {}
                for t, peer in sends:
                    assert t is not None, "a send of an interleaved stage has a tensor"
                    to = self.leaders[peer]
                    by_group.setdefault(to, []).append(dist.P2POp(
                        dist.isend, t.detach().to(self.dtype).contiguous(), to, group=self.peer_groups.get(to)))
                for buf, (_, peer) in zip(bufs, recvs):
                    src = self.leaders[peer]
                    by_group.setdefault(src, []).append(dist.P2POp(dist.irecv, buf, src,
                                                                   group=self.peer_groups.get(src)))
                reqs = [req for ops in by_group.values() for req in dist.batch_isend_irecv(ops)]
                for req in reqs:
                    req.wait()
            if self.tp_group is not None:
                for buf in bufs:
                    dist.broadcast(buf, src=self.stage.leader, group=self.tp_group)
        return bufs

"""Stage-boundary communication where a side splits the sequence (``cp > 1``): the schedule API of
:class:`executor.parallel.p2p.StageComm`, with every CP slot's leader exchanging exactly the tokens
it shares with each slot leader across the boundary (:func:`planner.cp_layout.shared_intervals`),
then broadcasting what it received inside its slot's TP group.

Any pair of CP degrees works (equal ``cp``: slot ``r`` to slot ``r``; ``cp -> 1``: every slot to
the one leader, which places the pieces at their positions; ``1 -> cp``; ``2 -> 4`` ...), with any
TP degrees on either side, because a slot's activations are replicated across its TP ranks. An
interleaved pipeline's rounds post the same way (:meth:`CPStageComm.exchange`: peers by stage index,
``StageTopo.stage_leaders``, the last stage's slots sending to the first's between chunks); the
messages of every slot leader are :func:`planner.schedules.slot_comm.slot_exchanges`, which the
tests play without a wait for every schedule and mix of cp degrees.

Deadlock freedom: one exchange posts all its sends and receives with every peer before waiting
for any of them (one ``batch_isend_irecv`` per peer, each on that pair's own group, so NCCL runs
them on separate communicators and a pair's send and receive are grouped), so a stage's slot
leaders together act like the single leader of :mod:`executor.parallel.p2p`: an exchange completes once
every peer has posted its side, which the schedules' argument guarantees for a stage as a whole.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from executor.train.trace import NO_TRACE, NullTrace, StepTrace
from planner.cp_layout import local_offset, shared_intervals
from planner.layout import StageTopo


class CPStageComm:
    """p2p of one rank of ``stage`` (a CP slot's TP group); ``boundary(a, b)`` gives the two-rank
    group of slot leaders ``a`` and ``b`` (:meth:`executor.parallel.groups.ProcessGroups.boundary`)."""

    def __init__(self, stage: StageTopo, rank: int, tp_group: Any, *, device: torch.device,
                 boundary: Callable[[int | None, int | None], Any], dtype: torch.dtype = torch.float32):
        self.stage = stage
        self.rank = rank
        self.tp_group = tp_group
        self.boundary = boundary
        self.device = device
        self.dtype = dtype
        self.is_leader = rank == stage.leader
        self.trace: NullTrace | StepTrace = NO_TRACE

    def _peers(self, forward: bool) -> tuple[int, ...]:
        st = self.stage
        if forward:
            return st.next_leaders or ((st.next_leader,) if st.next_leader is not None else ())
        return st.prev_leaders or ((st.prev_leader,) if st.prev_leader is not None else ())

    def _exchange(self, send: torch.Tensor | None, send_next: bool | None, shape: tuple[int, ...] | None,
                  recv_next: bool | None) -> torch.Tensor | None:
        """Send ``send`` to the next (``send_next``) or previous stage and/or receive this rank's
        ``shape`` tensor from the next (``recv_next``) or previous one; None for no such side."""
        to = self._peers(send_next) if send is not None and send_next is not None else ()
        frm = self._peers(recv_next) if shape is not None and recv_next is not None else ()
        if not to and not frm:
            return None
        with self.trace.span("p2p"):
            return self._exchange_now(send, to, shape if frm else None, frm)

    def _exchange_now(self, send: torch.Tensor | None, to: tuple[int, ...], shape: tuple[int, ...] | None,
                      frm: tuple[int, ...]) -> torch.Tensor | None:
        buf = None if shape is None else torch.empty(shape, dtype=self.dtype, device=self.device)
        self._transfer([(send, to)] if send is not None else [], [(buf, frm)] if buf is not None else [])
        if buf is not None and self.tp_group is not None:
            dist.broadcast(buf, src=self.stage.leader, group=self.tp_group)
        return buf

    def _transfer(self, sends: list[tuple[torch.Tensor, tuple[int, ...]]],
                  recvs: list[tuple[torch.Tensor, tuple[int, ...]]]) -> None:
        """Leader: post every tensor of ``sends`` piece-wise to its slot leaders and fill every
        buffer of ``recvs`` from its slot leaders — one ``batch_isend_irecv`` per peer on that
        pair's group (sends first, then receives, each in the given order), all posted before any
        is waited for. A follower does nothing (its leader broadcasts afterwards)."""
        if not self.is_leader or not (sends or recvs):
            return
        st = self.stage
        ops: dict[int, list[dist.P2POp]] = {}
        for send, to in sends:  # each tensor its own length (packed micro-batches differ)
            x = send.detach().to(self.dtype)
            for j, peer in enumerate(to):
                pieces = self._pieces(x.shape[1] * st.cp, len(to), j)
                if pieces:
                    out = torch.cat([x[:, a:b] for a, b in pieces], dim=1).contiguous()
                    ops.setdefault(peer, []).append(
                        dist.P2POp(dist.isend, out, peer, group=self.boundary(st.leader, peer)))
        received: list[tuple[torch.Tensor, list[tuple[int, int]], torch.Tensor]] = []
        for buf, frm in recvs:
            for j, peer in enumerate(frm):
                pieces = self._pieces(buf.shape[1] * st.cp, len(frm), j)
                if pieces:
                    rb = torch.empty((buf.shape[0], sum(b - a for a, b in pieces), *buf.shape[2:]),
                                     dtype=self.dtype, device=self.device)
                    received.append((buf, pieces, rb))
                    ops.setdefault(peer, []).append(
                        dist.P2POp(dist.irecv, rb, peer, group=self.boundary(st.leader, peer)))
        reqs = [req for peer in sorted(ops) for req in dist.batch_isend_irecv(ops[peer])]
        for req in reqs:
            req.wait()
        for buf, pieces, rb in received:
            off = 0
            for a, b in pieces:
                buf[:, a:b].copy_(rb[:, off:off + b - a])
                off += b - a

    def _pieces(self, seq: int, peer_cp: int, peer: int) -> list[tuple[int, int]]:
        """Local index ranges of the tokens this slot shares with CP rank ``peer`` of ``peer_cp``,
        in global order (the peer lays them out in the same order)."""
        st = self.stage
        return [(o, o + b - a) for a, b in shared_intervals(seq, st.cp, st.cp_rank, peer_cp, peer)
                for o in [local_offset(seq, st.cp, st.cp_rank, a)]]

    # -------------------------------------------------------------------------- schedule API
    def recv_forward(self, shape: tuple[int, ...]) -> torch.Tensor | None:
        return self._exchange(None, None, shape, False)

    def send_forward(self, y: torch.Tensor) -> None:
        self._exchange(y, True, None, None)

    def recv_backward(self, shape: tuple[int, ...]) -> torch.Tensor | None:
        return self._exchange(None, None, shape, True)

    def send_backward(self, dx: torch.Tensor | None) -> None:
        self._exchange(dx, False, None, None)

    def send_forward_recv_backward(self, y: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor | None:
        return self._exchange(y, True, shape, True)

    def send_backward_recv_forward(self, dx: torch.Tensor | None, shape: tuple[int, ...]) -> torch.Tensor | None:
        return self._exchange(dx, False, shape, False)

    def exchange(self, sends: list[tuple[torch.Tensor | None, int]],
                 recvs: list[tuple[tuple[int, ...], int]]) -> list[torch.Tensor]:
        """Interleaved pipelines (:func:`executor.parallel.schedules.run_rounds`): post ``sends``
        (tensor, peer stage) and ``recvs`` (this rank's shape, peer stage) together, piece-wise with
        each peer stage's slot leaders (``StageTopo.stage_leaders``; :meth:`_transfer`), and wait; then
        broadcast each received tensor inside the TP group, in order. The messages each slot leader
        posts, and why no two wait on each other, are :func:`planner.schedules.slot_comm.slot_exchanges`."""
        if not sends and not recvs:
            return []
        ring = self.stage.stage_leaders
        bufs = [torch.empty(shape, dtype=self.dtype, device=self.device) for shape, _ in recvs]
        out: list[tuple[torch.Tensor, tuple[int, ...]]] = []
        for t, peer in sends:
            assert t is not None, "a send of an interleaved stage has a tensor"
            out.append((t, ring[peer]))
        with self.trace.span("p2p"):
            self._transfer(out, [(buf, ring[peer]) for buf, (_, peer) in zip(bufs, recvs)])
            if self.tp_group is not None:
                for buf in bufs:
                    dist.broadcast(buf, src=self.stage.leader, group=self.tp_group)
        return bufs

"""Switching a running job to another plan between two steps: the training state moves directly from
the old layout to the new one (:mod:`planner.state_move_plan`), no checkpoint, no restart of the staying
processes.

Order of events (one :func:`switch` call on every process of the old or the new plan):

0. Before the call (the caller, ahead of the switch where it can): new members build the new
   plan's engine without its process groups and without initial values, and take the tensors the
   state will land in — the engine's own (:class:`executor.state.state_pieces.NewState`).
1. Old members drain their engine (no collective of the old plan left in flight) and take views
   of its state (:func:`executor.state.state_pieces.held_tensors`). Old members *retire* the old plan's groups
   (:mod:`executor.parallel.group_retire`): detached from torch.distributed, alive and unused, destroyed
   after the new plan's first step (``retire_s``) — not here, where each NCCL communicator's fixed
   destroy cost sat on the switch's critical path.
2. **The switch world** — a default group holding every process that sends or receives
   (:mod:`executor.switch.epoch_world`): if no device joins, the old world as it is; if none leaves, the
   new plan's world (joiners included); else a world of :attr:`ReshardPlan.devices` (the new
   plan's devices, then the leaving ones). A world left behind — here the old one, in step 5 the
   switch world — is retired too, not destroyed.
3. **Connecting**: once every member of the switch world has arrived (a meeting on the store,
   ``connect_wait_s``), a process posts one ``batch_isend_irecv`` holding, for each of its pairs of
   :meth:`ReshardPlan.pairs`, one element to the peer and one from it, and waits for them (and the
   device). NCCL sets up the connection between two ranks of a communicator inside their first
   point-to-point call, on every channel their point-to-point traffic may use whatever the size
   (``enqueue.cc`` marks ``p2pnChannelsPerPeer`` channels; the group's end connects them); here it
   does so for every pair that will exchange, so the exchange below times the transfer alone, and
   the set-up counts with the communicators' (``connect_s``, part of :attr:`SwitchStats.comm_s`),
   which the elastic target reports apart. (Gloo connects every pair when the group is created:
   there this costs one tiny message each way; so does NCCL on a world kept as it is, whose pairs
   the elastic job connected ahead, :meth:`~executor.switch.epoch_world.World.connect_all`.)
4. Packing, then **the exchange**, on the switch world itself, and beside it **the kept pieces**
   (:mod:`executor.switch.keep_local`: a whole holding kept in place is adopted by the new engine,
   the old tensor itself; the rest copied). They are kept after the exchange is posted, so that the
   host's book-keeping (3-5 ms for a 1.3B model) and the copies (queued on the compute stream while
   NCCL's run on its own) hide under the transfer: no received piece lands in a holding written
   by a kept one or adopted (adopted holdings are covered by kept pieces alone), and the old
   tensors are only read. (Kept first, on 4x H100 2026-11-27 17:33 the slowest rank's 10-12 ms of
   ``local`` came before its 30 ms of exchange.) Before the
   exchange the pairs ping again (the batch of step 3, on connected pairs: microseconds), so that
   waiting for a peer still packing is reported apart (``exchange_wait_s``) and ``exchange_s`` is
   the transfer alone. Then a process posts one
   ``batch_isend_irecv`` holding, for each of its pairs of :meth:`ReshardPlan.pairs` in that global
   order, its pieces for the peer and the peer's pieces for it, each piece one fp32 message (in
   plan order, tagged with its index in the pair's message: NCCL matches a pair's messages in
   order, gloo by tag); it waits for all of them. A piece goes straight from the old engine's
   tensor and straight into the new one's wherever its view there is contiguous fp32 (every piece
   of the 4x H100 trace's plans, TP 1): nothing is packed or unpacked, no staging buffer is
   allocated. Only a strided piece (a TP shard's columns) is copied into a buffer to send
   (``pack_s``, ``packed_bytes``) or received into one and copied into place (``unpack_s``).
   (The first version sent one flat buffer per pair: on 4x H100, 2026-11-27 09:31, the join's
   slowest rank packed 5.75 GB for 26 ms and the joiner unpacked for 18.5 ms while its peers
   waited for it.)
5. Leaving processes retire the switch world and release everything they retired, in order,
   meeting the other holders at their retire point (their caller then exits); the new plan's
   processes enter the new plan's world (unless the switch world is already it). The caller then
   builds :class:`~executor.parallel.groups.ProcessGroups`, attaches them to the engine of step 0
   (:meth:`~executor.train.engine.Engine.attach`), sets its step count (:meth:`NewState.install`),
   continues at the next step with the same data position, and
   releases :attr:`SwitchResult.retired` right after that step, in order (:meth:`Retired.release`).
   Each process's list is a subsequence of one order — the old plan's groups, the old world, the
   switch world — and is released in it, so no two holders wait on each other's store meetings.

Every interval of the call is charged to one part of :class:`SwitchStats` (waits for peers, here
and before a new default group is created, are parts of their own), so the parts add up to the
call's time (``total_s``); the elastic job computes this device's holdings with the move, ahead
(``states``: tens of ms of Python for a 1.3B model that were on the switch's path).

Why no two processes wait on each other, in steps 3 and 4 alike: every posted send has its matching
receive posted by the peer (both compute the same :class:`ReshardPlan`, hence the same pairs), and
each process posts all of its messages of the step in one batch — on NCCL one grouped call, which
NCCL schedules as a whole, as it does an all-to-all; on gloo posting never blocks. A process waits
for its whole connecting batch before it posts its exchange, so between two processes the two
steps' messages are matched in that order on both sides. Nothing else runs on the world meanwhile.

Why no pair groups (the first version had one per pair, as the plan's p2p has): on 4x H200 creating
or destroying one NCCL communicator costs 300-500 ms whatever it carried
(``benchmarks/executor/group_teardown.py``), and the pair groups' set-up and tear-down were 1-2.5 s
of each switch; the world's own communicator already joins every pair, and a batch to several
peers on it is the pattern NCCL's all-to-all uses. For the same reason no communicator is
destroyed inside the switch at all: the old plan's groups and the worlds left behind (119-487 ms
each on 4x H200, run 4's ``leave``) are destroyed at the retire point.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from executor.parallel.group_retire import Retired
from executor.parallel.store_meet import meet
from executor.state.state_pieces import NewState, held_tensors, narrow
from executor.switch.epoch_world import World, ping
from executor.switch.keep_local import keep
from executor.train.engine import Engine
from planner.state_layout import RankState, rank_states
from planner.state_move_plan import ReshardPlan


@dataclass
class SwitchStats:
    """This process's times of :func:`switch`. The parts are laps of one clock, each ending with a
    device sync (the work of a part is its own): :data:`SWITCH_PARTS` plus :attr:`comm_s` add up to
    :attr:`total_s`, the whole call. Waiting for peers is a part of its own (``*_wait_s``): the part
    after it starts with every peer there, so the slowest rank's figure of a part is its own work."""

    bytes_sent: int = 0
    bytes_received: int = 0
    local_bytes: int = 0  # the pieces this process keeps (ReshardPlan.local)
    adopted_bytes: int = 0  # of local_bytes, those the new engine took over in place, not copied (keep_local)
    packed_bytes: int = 0  # bytes of strided pieces staged through a buffer (sent or received); 0 if none
    world_setup_s: float = 0.0  # default groups created for the switch and the new plan
    connect_s: float = 0.0  # every exchanging pair of this process connected (step 3)
    transfer_s: float = 0.0  # local copies + the exchange (packing and unpacking included, waits not)
    drain_s: float = 0.0  # the old engine drained and its state viewed (and the holdings, unless given)
    close_s: float = 0.0  # the old plan's groups retired (detached; destroyed later: retire_s)
    world_wait_s: float = 0.0  # waiting on the store for a new default group's last member
    connect_wait_s: float = 0.0  # waiting on the store for the switch world's last member to connect
    local_s: float = 0.0  # the host's part of keeping pieces (keep_local), while the exchange runs
    pack_s: float = 0.0  # outgoing pieces packed into one buffer per peer
    exchange_wait_s: float = 0.0  # waiting for the peers to have packed (one ping batch, step 4)
    exchange_s: float = 0.0  # posting every pair's batch to the last receive done (the kept copies beside it)
    unpack_s: float = 0.0  # received buffers copied into the new layout
    leave_s: float = 0.0  # default groups left: retired (detached; destroyed later: retire_s)
    other_s: float = 0.0  # the rest: book-keeping between the parts above
    total_s: float = 0.0  # the whole call (a leaving process's release at its end not included)
    # the old plan's groups and the worlds left destroyed (executor.parallel.group_retire), not in the switch:
    # on a leaving process at its end, elsewhere after the new plan's first step (set by the caller)
    retire_s: float = 0.0
    peers: list[str] = field(default_factory=list)

    @property
    def comm_s(self) -> float:
        """Communicator set-up inside the switch: default groups created, pairs connected."""
        return self.world_setup_s + self.connect_s

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


# the parts of SwitchStats.total_s besides comm_s, in the order they happen
SWITCH_PARTS = ("drain_s", "close_s", "leave_s", "world_wait_s", "connect_wait_s", "pack_s", "exchange_wait_s",
                "local_s", "exchange_s", "unpack_s", "other_s")


@dataclass
class SwitchResult:
    state: NewState | None  # None on a process that leaves
    stats: SwitchStats
    # what this process retired, in order (module docstring, step 5): the old plan's groups, the old
    # world, the switch world — those it held; alive until released after the new plan's first step
    # (empty on a leaving process: it released them)
    retired: list[Retired] = field(default_factory=list)


def switch_members(rp: ReshardPlan) -> tuple[str, ...]:
    """The switch world's devices in rank order (module docstring, step 2)."""
    if not rp.joining:
        return tuple(rp.old.devices)
    if not rp.leaving:
        return tuple(rp.new.devices)
    return rp.devices


def _state_of(states: list[RankState], device: str) -> RankState | None:
    return next((s for s in states if s.device == device), None)


def switch(rp: ReshardPlan, *, me: str, world: World, engine: Engine | None, into: NewState | None, tag: str,
           also: Sequence[Any] = (), states: tuple[RankState | None, RankState | None] | None = None
           ) -> SwitchResult:
    """Move this process's part of the state per ``rp`` (module docstring); collective over every
    process of the old and the new plan. ``engine``: the old plan's engine (None on a joiner);
    ``into``: the new plan's state inside its engine, built before (None on a leaving device);
    ``also``: more groups of the old layout to retire with the engine's (a strategy pool's working
    layouts, :meth:`executor.switch.hot_switch.SwitchGroups.hand_over_extra`); ``states``: this
    device's holdings in the old and the new plan (:func:`holdings`), if computed ahead."""
    stats = SwitchStats()
    clock = _Clock(world.device, stats)
    old_state, new_state = states if states is not None else holdings(rp, me)
    if (engine is None) != (old_state is None):
        raise ValueError(f"{me}: an engine is given iff the device is in the old plan")
    if (into is None) != (new_state is None) or (into is not None and into.state != new_state):
        raise ValueError(f"{me}: the new state is given iff the device is in the new plan, as its holdings there")
    new = into
    if engine is not None:
        engine.drain()  # ZeRO-1's weight all-gathers: the weights complete, nothing left on the old groups
    held = held_tensors(engine, old_state) if engine is not None and old_state is not None else []
    clock.lap("drain_s")
    retired: list[Retired] = []
    if engine is not None:
        retired.append(Retired.take([*engine.groups.hand_over(), *also], store=world.store,
                                    key=f"{world.prefix}/retire/{tag}", count=len(rp.old.devices),
                                    device=world.device, who=me, timeout_s=world.timeout_s))
    clock.lap("close_s")
    world.enter(switch_members(rp), f"{tag}/switch", retire=retired)
    clock.lap("other_s", **world.times())
    rank_of = {d: i for i, d in enumerate(world.members)}

    mine = [(a, b) for a, b in rp.pairs() if me in (a, b)]
    peers = [rank_of[b if a == me else a] for a, b in mine]
    clock.lap("other_s")
    meet(world.store, f"{world.prefix}/{tag}/connect", len(world.members), timeout_s=world.timeout_s, who=me)
    clock.lap("connect_wait_s")  # a world kept as it is has no meeting of its own before the pairs connect
    ping(peers, world.device)
    clock.lap("connect_s")
    src = old_state.holdings if old_state is not None else ()
    dst = new_state.holdings if new_state is not None else ()
    outbox: dict[str, list[torch.Tensor]] = {}
    for a, b in mine:
        peer = b if a == me else a
        out = rp.messages.get((me, peer), ())
        if out:
            outbox[peer] = _wire([narrow(held[p.src_slot], src[p.src_slot].chunk, p.chunk) for p in out], stats,
                                 send=True)
    clock.lap("pack_s")
    ping(peers, world.device)  # every peer has packed: the exchange below times the transfer alone
    clock.lap("exchange_wait_s")
    inbox: list[tuple[torch.Tensor, torch.Tensor]] = []  # (a received buffer, the strided view it goes to)
    ops = []
    for a, b in mine:  # one batch holding every message of this process, in the global pair order
        peer = b if a == me else a
        stats.peers.append(peer)
        for k, t in enumerate(outbox.get(peer, ())):
            ops.append(dist.P2POp(dist.isend, t, rank_of[peer], tag=k))
            stats.bytes_sent += t.numel() * 4
        incoming = rp.messages.get((peer, me), ())
        if incoming:
            assert new is not None
            views = [narrow(new.tensors[p.dst_slot], dst[p.dst_slot].chunk, p.chunk) for p in incoming]
            for k, (view, t) in enumerate(zip(views, _wire(views, stats, send=False))):
                ops.append(dist.P2POp(dist.irecv, t, rank_of[peer], tag=k))
                stats.bytes_received += t.numel() * 4
                if t is not view:
                    inbox.append((t, view))
    reqs = dist.batch_isend_irecv(ops) if ops else []
    local, local_s = rp.local(me), 0.0  # kept beside the transfer: nothing received lands where one is kept
    if local:
        assert new is not None and engine is not None
        t0 = time.perf_counter()
        kept = keep(local, old=engine, held=held, src=src, new=new)
        local_s = time.perf_counter() - t0  # the host's part; its copies run under the exchange
        stats.local_bytes += kept.adopted_bytes + kept.copied_bytes
        stats.adopted_bytes += kept.adopted_bytes
    for req in reqs:
        req.wait()
    clock.lap("exchange_s", local_s=local_s)
    ops.clear()
    outbox.clear()
    if inbox:
        _copy([v for _, v in inbox], [t for t, _ in inbox])
    inbox.clear()
    clock.lap("unpack_s")
    stats.transfer_s = stats.local_s + stats.pack_s + stats.exchange_s + stats.unpack_s

    held.clear()
    world.enter(rp.new.devices, f"{tag}/plan", retire=retired)
    clock.lap("other_s", **world.times())
    stats.total_s = clock.total()
    if new is None:  # a leaving process: with the other holders, at their retire point
        stats.retire_s = sum(r.release() for r in retired)
        retired = []
    return SwitchResult(new, stats, retired)


def holdings(rp: ReshardPlan, me: str) -> tuple[RankState | None, RankState | None]:
    """``me``'s holdings in the old and in the new plan of ``rp`` (None where it is not in one):
    tens of ms of Python for a 1.3B model, so the elastic job computes them with the move, ahead."""
    return _state_of(rank_states(rp.old), me), _state_of(rank_states(rp.new), me)


class _Clock:
    """Laps of one clock charged to :class:`SwitchStats` fields, each lap ending with a device sync
    (the work of a part is its own); the laps add up to :meth:`total`."""

    def __init__(self, device: torch.device, stats: SwitchStats):
        self.device = device
        self.stats = stats
        self.t = self.t0 = time.perf_counter()

    def lap(self, part: str, **inside: float) -> None:
        """Charge the time since the last lap to ``part``, less the seconds ``inside`` names (parts
        timed within this lap, charged to themselves)."""
        _sync(self.device)
        now = time.perf_counter()
        dt, self.t = now - self.t, now
        for name, seconds in inside.items():
            setattr(self.stats, name, getattr(self.stats, name) + seconds)
            dt -= seconds
        setattr(self.stats, part, getattr(self.stats, part) + dt)

    def total(self) -> float:
        return self.t - self.t0


def direct(view: torch.Tensor) -> bool:
    """Whether a piece's view can be sent or received as it is (one fp32 message, no copy)."""
    return view.dtype == torch.float32 and view.is_contiguous()


def _wire(views: list[torch.Tensor], stats: SwitchStats, *, send: bool) -> list[torch.Tensor]:
    """What goes on the wire for each piece's view: the view itself where :func:`direct`, else a
    contiguous fp32 buffer of its shape — filled from the view here when ``send`` (the rest, one
    torch call), received into and copied into place by the caller otherwise."""
    out = [v if direct(v) else torch.empty(v.shape, dtype=torch.float32, device=v.device) for v in views]
    staged = [(t, v) for t, v in zip(out, views) if t is not v]
    stats.packed_bytes += sum(t.numel() for t, _ in staged) * 4
    if send and staged:
        _copy([t for t, _ in staged], [v for _, v in staged])
    return out


def _copy(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    """``dst[i].copy_(src[i])`` for every i, in one torch call (still one copy kernel per strided
    piece: on 4x H200 the parts took as long as with a Python loop, benchmarks/executor/elastic.py, 2026-11-26)."""
    torch._foreach_copy_(dst, src)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)

"""Which peer each op of a schedule talks to, and the order of the messages every stage posts.

With ``v`` layer chunks per stage, chunk ``c`` of stage ``i`` of ``S`` is virtual stage
``k = c·S + i``; an ``F`` receives from virtual stage ``k-1`` and sends to ``k+1``, a ``B`` the
other way round, a ``W`` talks to no one. Virtual stage ``k±1`` lives on stage ``(k±1) mod S``:
between chunks the last stage sends to the first (``v = 1``: plain neighbours).

**Pairing rule** (what :mod:`executor.parallel.schedules` posts). One chunk per stage: an op's
send is posted together with the next op's receive when both are with the same peer stage (one
``batch_isend_irecv``), else alone, then the next op's receive alone — 1F1B's, GPipe's and ZB-H1's
order, Megatron's. With several chunks that order waits in a ring (every stage sending to the next
in the warm-up, or two neighbours sending to each other in the steady state), so there the ops run
in *rounds* (:func:`rounds`: an ``F`` alone, or a steady-state ``F`` and the ``B`` after it) and
between two rounds one exchange posts the sends of the round just run together with the receives
of the next, sends first, each in op order — Megatron's interleaved order
(``send_forward_recv_forward`` in the warm-up, four-message batches in the steady state).

:func:`check_pairing` plays all stages' exchanges against each other with sends that block until
received (NCCL's rendezvous) and says where they would wait on each other, or which receive would
take another op's tensor; the tests run it over the registry's schedules and pipeline shapes.
Stages that split the sequence (``cp > 1``) post each message piece-wise between slot leaders:
:mod:`planner.schedules.slot_comm` expands :func:`steps` (the exchanges with each op's compute
between them) per slot leader for the same check.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.schedules.ops import StageOp


@dataclass(frozen=True)
class OpPeers:
    """Stage indices an op receives its input from and sends its output to (None: no message)."""

    recv: int | None
    send: int | None


def op_peers(op: StageOp, stages: int, stage: int, chunks: int = 1) -> OpPeers:
    if op.kind == "W":
        return OpPeers(None, None)
    k = op.chunk * stages + stage
    before = (k - 1) % stages if k > 0 else None
    after = (k + 1) % stages if k < chunks * stages - 1 else None
    return OpPeers(before, after) if op.kind == "F" else OpPeers(after, before)


def rounds(ops: Sequence[StageOp], chunks: int = 1) -> list[list[int]]:
    """Op indices grouped into rounds: with one chunk every op is its own round; with several, the
    steady state (a ``B`` right after an ``F``, once backwards have begun before the last ``F``)
    runs in ``F, B`` rounds, Megatron's; the warm-up forwards and cool-down backwards alone. A stage
    that runs every forward before its first backward (``m = S``) has no steady state: pairing its
    last ``F`` with the first ``B`` would wait for a gradient that needs that ``F``'s output."""
    kinds = [op.kind for op in ops]
    last_f = max((k for k, x in enumerate(kinds) if x == "F"), default=-1)
    steady = chunks > 1 and "B" in kinds[:last_f]
    out: list[list[int]] = []
    for k, kind in enumerate(kinds):
        if steady and out and kind == "B" and kinds[k - 1] == "F" and len(out[-1]) == 1:
            out[-1].append(k)
        else:
            out.append([k])
    return out


def fused_with_next(ops: Sequence[StageOp], stages: int, stage: int, chunks: int = 1) -> list[bool]:
    """One chunk: per op, its send is posted together with the next op's receive (module docstring)."""
    peers = [op_peers(op, stages, stage, chunks) for op in ops]
    return [p.send is not None and k + 1 < len(ops) and peers[k + 1].recv == p.send for k, p in enumerate(peers)]


@dataclass(frozen=True)
class Message:
    """One message of an exchange: to (``send``) or from ``peer``; ``what``: the tensor,
    ``(kind, micro-batch, virtual stage that takes it)`` — an ``F`` message is the activation, a ``B``
    message the gradient of the taking virtual stage's output."""

    peer: int
    send: bool
    what: tuple[str, int, int]


def _messages(op: StageOp, peers: OpPeers, stages: int, stage: int) -> tuple[Message | None, Message | None]:
    """The op's receive and send messages."""
    k = op.chunk * stages + stage
    step = 1 if op.kind == "F" else -1
    recv = Message(peers.recv, False, (op.kind, op.micro_batch, k)) if peers.recv is not None else None
    send = Message(peers.send, True, (op.kind, op.micro_batch, k + step)) if peers.send is not None else None
    return recv, send


Step = tuple[Message, ...] | int  # an exchange, or the compute of op ``k`` (between its receive and its send)


def steps(ops: Sequence[StageOp], stages: int, stage: int, chunks: int = 1) -> list[Step]:
    """What ``stage`` does for ``ops``, in order: its exchanges (messages posted together, then
    waited for; the pairing rule of the module docstring; within one exchange sends come first, then
    receives, each in op order) and, as op indices, where each op computes."""
    msgs = [_messages(op, op_peers(op, stages, stage, chunks), stages, stage) for op in ops]
    out: list[Step] = []
    if chunks > 1:  # at each round boundary: the last round's sends with the next round's receives
        sends: list[Message] = []
        for r in rounds(ops, chunks):
            batch = sends + [m for k in r if (m := msgs[k][0]) is not None]
            if batch:
                out.append(tuple(batch))
            out += r
            sends = [m for k in r if (m := msgs[k][1]) is not None]
        return out + ([tuple(sends)] if sends else [])
    return paired(msgs, fused_with_next(ops, stages, stage, chunks), computes=True)


def exchanges(ops: Sequence[StageOp], stages: int, stage: int, chunks: int = 1) -> list[tuple[Message, ...]]:
    """The exchanges of :func:`steps`, without the computes."""
    return only_exchanges(steps(ops, stages, stage, chunks))


def only_exchanges(order: Sequence[Step]) -> list[tuple[Message, ...]]:
    return [s for s in order if not isinstance(s, int)]


def paired(msgs: Sequence[tuple[Message | None, Message | None]],
           fused: Sequence[bool], computes: bool = False) -> list[Step]:
    """1F1B's rule: each op's receive alone, its send batched with the next op's receive where
    ``fused`` says so (that receive is then not posted again); with ``computes``, each op's index
    between its receive and its send."""
    out: list[Step] = []
    for k, (recv, send) in enumerate(msgs):
        if recv is not None and not (k > 0 and fused[k - 1]):
            out.append((recv,))
        if computes:
            out.append(k)
        if send is not None:
            nxt = msgs[k + 1][0] if fused[k] else None
            out.append((send,) + ((nxt,) if nxt is not None else ()))
    return out


def check_pairing(orders: Sequence[Sequence[tuple[Message, ...]]]) -> str | None:
    """Play every stage's exchanges with blocking sends: a stage posts its next exchange once every
    message of the current one has completed; the messages from one stage to another match in
    posting order, and a match completes both. None when every stage finishes and every receive got
    the tensor it expects, else what went wrong."""
    pos = [0] * len(orders)
    sends: dict[tuple[int, int], list[tuple[Message, list[int]]]] = {}  # (from, to) -> posted, unmatched
    recvs: dict[tuple[int, int], list[tuple[Message, list[int]]]] = {}
    pending = [[0] for _ in orders]  # unmatched messages of each stage's current exchange

    def post(i: int) -> None:
        if pos[i] < len(orders[i]):
            ex = orders[i][pos[i]]
            pending[i] = [len(ex)]
            for m in ex:
                chan = (i, m.peer) if m.send else (m.peer, i)
                (sends if m.send else recvs).setdefault(chan, []).append((m, pending[i]))

    for i in range(len(orders)):
        post(i)
    moved = True
    while moved:
        moved = False
        for chan in list(sends):
            while sends[chan] and recvs.get(chan):
                (s, ps), (r, pr) = sends[chan].pop(0), recvs[chan].pop(0)
                if s.what != r.what:
                    return f"stage {chan[1]} receives {r.what} from stage {chan[0]}, which sends {s.what}"
                ps[0] -= 1
                pr[0] -= 1
                moved = True
        for i in range(len(orders)):
            while pos[i] < len(orders[i]) and pending[i][0] == 0:
                pos[i] += 1
                post(i)
                moved = True
    stuck = [f"stage {i} waits in {orders[i][pos[i]]}" for i in range(len(orders)) if pos[i] < len(orders[i])]
    return "; ".join(stuck) or None

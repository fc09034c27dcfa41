"""The messages of a pipeline whose stages split the sequence (``cp > 1``), per CP slot leader.

A stage of ``cp`` CP slots does not send one tensor per message: each slot leader sends its
tokens piece-wise to every slot leader of the peer stage that holds some of them
(:func:`planner.cp_layout.boundary_peers`), and receives its tokens from the same (the executor's
:mod:`executor.parallel.cp_p2p`, for one chunk and for interleaved rounds alike, with the wrap from
the last stage's chunk to the first's next chunk). Every slot of a stage posts the stage's
exchanges (:func:`planner.schedules.comm.steps`) in the same order, each stage message expanded to
one message per sharing slot leader, all of one exchange posted before any is waited for. Between
its exchanges a slot computes, and each ``F`` and ``B`` of a ``cp > 1`` stage runs collectives
over the stage's slots (attention's K/V all-gathers, :mod:`executor.parallel.context_parallel`):
modelled as a barrier of the slots (every slot sends to and receives from every other), which is
what could tie one slot's wait for its peer stage to another slot's.

:func:`slot_exchanges` builds those orders; :func:`planner.schedules.comm.check_pairing` plays them
(parties: the stages' slot leaders in order, :func:`slot_parties`). Worked example, stage 0 of cp 2
sending ``F`` of micro-batch 0 to stage 1 of cp 1: slot 0 (party 0) and slot 1 (party 1) each send a
piece to party 2, which posts two receives in one exchange.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

from planner.cp_layout import boundary_peers
from planner.schedules.comm import Message, Step


def slot_parties(cps: Sequence[int]) -> list[int]:
    """The first party index of each stage (stage ``s``'s slot ``i`` is party ``out[s] + i``)."""
    return [0, *accumulate(cps)][:-1]


def slot_exchanges(orders: Sequence[Sequence[Step]], cps: Sequence[int]) -> list[list[tuple[Message, ...]]]:
    """Per party (:func:`slot_parties`), its exchanges: ``orders[s]`` (stage ``s``'s
    :func:`~planner.schedules.comm.steps`) with every message to or from stage ``t`` expanded to the
    slot leaders of ``t`` that share tokens with this slot, and every compute of a ``cp > 1`` stage a
    barrier of its slots."""
    first = slot_parties(cps)
    out: list[list[tuple[Message, ...]]] = []
    for s, order in enumerate(orders):
        for i in range(cps[s]):
            mine: list[tuple[Message, ...]] = []
            for step in order:
                if isinstance(step, int):
                    if cps[s] > 1:
                        others = [first[s] + j for j in range(cps[s]) if j != i]
                        what = ("C", step, s)  # op ``step``'s collectives over the stage's slots
                        mine.append(tuple(Message(o, True, what) for o in others)
                                    + tuple(Message(o, False, what) for o in others))
                    continue
                mine.append(tuple(Message(first[m.peer] + j, m.send, m.what) for m in step
                                  for j in _sharing(cps[s], i, cps[m.peer], m.send)))
            out.append(mine)
    return out


def _sharing(cp: int, slot: int, peer_cp: int, send: bool) -> list[int]:
    """Slots of a ``peer_cp`` stage that share tokens with ``slot`` of a ``cp`` stage, in CP-rank
    order (the order the executor's slot leaders post them in)."""
    if send:
        return [j for a, j in boundary_peers(cp, peer_cp) if a == slot]
    return [j for j, b in boundary_peers(peer_cp, cp) if b == slot]

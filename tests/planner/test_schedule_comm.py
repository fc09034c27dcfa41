"""The messages every stage posts (planner.schedules.comm) never wait on each other, for every
registered schedule and pipeline shape; interleaving needs its rounds (the one-chunk rule waits in a
ring), and the check notices a message taken by the wrong op."""

from __future__ import annotations

import pytest

from planner.schedules import SCHEDULE_NAMES, schedule_named
from planner.schedules.comm import Message, check_pairing, exchanges, rounds
from planner.schedules.interleaved import interleaved_ops


def _orders(name: str, stages: int, m: int) -> list[list[tuple[Message, ...]]]:
    s = schedule_named(name)
    return [exchanges(s.ops(stages, i, m), stages, i, s.chunks) for i in range(stages)]


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_every_schedule_pairs_without_waits(name: str) -> None:
    sched = schedule_named(name)
    for stages in range(1, 6):
        for m in range(1, 3 * stages + 1):
            if sched.requires is not None and sched.requires(stages, m):
                continue
            assert check_pairing(_orders(name, stages, m)) is None, (name, stages, m)


@pytest.mark.parametrize("chunks", [3, 4])
def test_more_chunks_pair_without_waits(chunks: int) -> None:
    for stages in range(2, 6):
        for m in range(stages, 4 * stages + 1, stages):
            orders = [exchanges(interleaved_ops(stages, i, m, chunks), stages, i, chunks) for i in range(stages)]
            assert check_pairing(orders) is None, (chunks, stages, m)


def test_interleaved_with_the_one_chunk_rule_waits_in_a_ring() -> None:
    """Posting each send alone or with the next receive from the same peer (1F1B's rule) deadlocks
    interleaved pipelines: every stage sends to the next in the warm-up."""
    from planner.schedules import comm

    stages, m = 4, 8
    one_chunk = []
    for i in range(stages):
        ops = interleaved_ops(stages, i, m)
        fused = comm.fused_with_next(ops, stages, i, 2)
        msgs = [comm._messages(op, comm.op_peers(op, stages, i, 2), stages, i) for op in ops]
        one_chunk.append(comm.paired(msgs, fused))  # 1F1B's pairing rule on interleaved ops
    assert "waits in" in (check_pairing(one_chunk) or "")


def test_a_message_taken_by_the_wrong_op_is_named() -> None:
    orders = _orders("interleaved-1f1b", 2, 4)
    ex = next(k for k, e in enumerate(orders[0]) if sum(x.send for x in e) == 2)  # a steady F, B round's sends
    orders[0][ex] = (orders[0][ex][1], orders[0][ex][0], *orders[0][ex][2:])
    assert "which sends" in (check_pairing(orders) or "")


def test_rounds_by_hand() -> None:
    """Stage 1 of 2, m=2: F0.0 F1.0 (F0.1 B0.1) (F1.1 B1.1) B0.0 B1.0; a stage that runs every forward
    first (stage 0 of 3, m=3) has no F, B round."""
    s = schedule_named("interleaved-1f1b")
    assert rounds(s.ops(2, 1, 2), 2) == [[0], [1], [2, 3], [4, 5], [6], [7]]
    assert all(len(r) == 1 for r in rounds(s.ops(3, 0, 3), 2))
    assert all(len(r) == 1 for r in rounds(schedule_named("1f1b").ops(3, 1, 4), 1))
